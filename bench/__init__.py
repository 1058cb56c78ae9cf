"""The benchmarks, a folder each over one shared core (bench/README.md says which to run for what)."""
