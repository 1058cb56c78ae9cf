"""docker-compose.yml cannot run here (no Docker engine): check that it says what the CLI and config accept."""

from pathlib import Path

import pytest
import yaml

from proxy_addon.cli import build_parser
from proxy_addon.config import load_config
from proxy_addon.db import parse_database_url

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_services_present(compose):
    assert {"postgres", "migrate", "proxy-1", "proxy-2", "reconcile"} <= set(compose["services"])


def test_postgres_has_volume_and_healthcheck(compose):
    pg = compose["services"]["postgres"]
    assert pg["healthcheck"]["test"]
    assert any(v.endswith("/var/lib/postgresql/data") for v in pg["volumes"])


@pytest.mark.parametrize("service", ["migrate", "proxy-1", "proxy-2", "reconcile"])
def test_commands_parse_with_the_cli(compose, service):
    command = compose["services"][service]["command"]
    args = build_parser().parse_args(command)
    assert args.handler is not None
    assert args.config == "/app/config.yaml"


@pytest.mark.parametrize("service", ["migrate", "proxy-1", "proxy-2", "reconcile"])
def test_services_share_postgres_and_secret(compose, service):
    env = compose["services"][service]["environment"]
    url = parse_database_url(env["RECEIPTS_DATABASE_URL"])
    assert url.get_backend_name() == "postgresql" and url.host == "postgres"
    assert "RECEIPTS_SECRET" in env


def test_proxies_wait_for_migration(compose):
    for name in ("proxy-1", "proxy-2", "reconcile"):
        assert compose["services"][name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert compose["services"]["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_mounted_config_is_valid():
    load_config(REPO / "config.yaml")


def test_dockerfile_installs_package_with_migrations():
    text = (REPO / "Dockerfile").read_text()
    assert "COPY migrations" in text and "pip install" in text and 'ENTRYPOINT ["receipts"]' in text
