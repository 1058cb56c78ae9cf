"""The fault suite (see conftest.py): a package, so that its conftest does not replace tests/conftest.py
as the module `conftest` that other test modules import from."""
