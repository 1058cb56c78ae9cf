"""The files the commands read at run time that the repository keeps outside the package.

Alembic's `migrations/` and the default `config.yaml` sit at the top of the repository. An install from the
wheel or sdist has no repository beside it: setup.py lays them into the package (`proxy_addon/migrations`,
`proxy_addon/config.example.yaml`). A checkout (editable, or on PYTHONPATH) has them beside the package. Each is
looked for inside the package first: an installed package must never read a checkout's files that happen to lie
one directory up.
"""

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def _inside_or_beside(packaged: str, in_repository: str) -> Path:
    inside = PACKAGE_DIR / packaged
    return inside if inside.exists() else PACKAGE_DIR.parent / in_repository


MIGRATIONS_DIR = _inside_or_beside("migrations", "migrations")
EXAMPLE_CONFIG = _inside_or_beside("config.example.yaml", "config.yaml")
# the file a plain mitmproxy loads: `mitmdump -s <ADDON_SCRIPT> --set receipts_config=config.yaml`
ADDON_SCRIPT = PACKAGE_DIR / "addon.py"
