"""What OpenTelemetry tracing costs per write (run.py)."""
