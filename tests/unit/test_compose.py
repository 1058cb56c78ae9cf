"""docker-compose.yml cannot run here (no Docker engine): check that it says what the CLI and config accept."""

from pathlib import Path

import pytest
import yaml

from proxy_addon.cli import build_parser
from proxy_addon.config import admin_settings, load_config
from proxy_addon.db import parse_database_url
from proxy_addon.exceptions import ConfigError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_services_present(compose):
    assert {"postgres", "migrate", "proxy-1", "proxy-2", "reconcile"} <= set(compose["services"])


def test_postgres_has_volume_and_healthcheck(compose):
    pg = compose["services"]["postgres"]
    assert pg["healthcheck"]["test"]
    assert any(v.endswith("/var/lib/postgresql/data") for v in pg["volumes"])


@pytest.mark.parametrize("service", ["migrate", "proxy-1", "proxy-2", "reconcile", "admin"])
def test_commands_parse_with_the_cli(compose, service):
    command = compose["services"][service]["command"]
    args = build_parser().parse_args(command)
    assert args.handler is not None
    assert args.config == "/app/config.yaml"


@pytest.mark.parametrize("service", ["migrate", "proxy-1", "proxy-2", "reconcile", "admin"])
def test_services_share_postgres_and_secret(compose, service):
    env = compose["services"][service]["environment"]
    url = parse_database_url(env["RECEIPTS_DATABASE_URL"])
    assert url.get_backend_name() == "postgresql" and url.host == "postgres"
    assert "RECEIPTS_SECRET" in env


def test_proxies_wait_for_migration(compose):
    for name in ("proxy-1", "proxy-2", "reconcile", "admin"):
        assert compose["services"][name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert compose["services"]["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_the_optional_admin_service_needs_its_token(compose, monkeypatch):
    """`docker compose --profile admin up`: it listens on all addresses inside its container, which the
    admin server allows only with the token that the compose file passes through."""
    admin = compose["services"]["admin"]
    assert admin["profiles"] == ["admin"] and "RECEIPTS_ADMIN_TOKEN" in admin["environment"]
    args = build_parser().parse_args(admin["command"])
    config = load_config(REPO / "config.yaml")
    monkeypatch.delenv("RECEIPTS_ADMIN_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="RECEIPTS_ADMIN_TOKEN"):
        admin_settings(config, listen_host=args.listen_host, listen_port=args.listen_port)
    monkeypatch.setenv("RECEIPTS_ADMIN_TOKEN", "a-token")
    assert admin_settings(config, listen_host=args.listen_host, listen_port=args.listen_port).listen_port == 8081


def test_mounted_config_is_valid():
    load_config(REPO / "config.yaml")


def test_dockerfile_installs_package_with_migrations():
    text = (REPO / "Dockerfile").read_text()
    assert "COPY migrations" in text and "pip install" in text and 'ENTRYPOINT ["receipts"]' in text


def _topology_module():
    import importlib.util
    import sys

    if "topology" not in sys.modules:
        spec = importlib.util.spec_from_file_location("topology", REPO / "scripts" / "topology.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["topology"] = module
        spec.loader.exec_module(module)
    return sys.modules["topology"]


def test_topology_script_runs_what_compose_runs(compose, tmp_path):
    """scripts/topology.py, the same topology without Docker: the same services with the same commands
    (their own loopback ports), one database URL and one RECEIPTS_SECRET for all (see tests/faults/)."""
    topology = _topology_module()
    t = topology.Topology(database_url="postgresql+psycopg://u@127.0.0.1/receipts", workdir=tmp_path)
    prefix = len(topology.receipts_command())
    parser = build_parser()
    assert set(t.services) == {"proxy-1", "proxy-2", "reconcile"} <= set(compose["services"])
    for name, service in {**t.services, "migrate": None}.items():
        args = t._migrate_args if service is None else service.args
        ours, theirs = parser.parse_args(args[prefix:]), parser.parse_args(compose["services"][name]["command"])
        assert ours.handler is theirs.handler, name
        assert getattr(ours, "loop", None) == getattr(theirs, "loop", None)
    assert len(set(t.proxy_ports)) == 2
    assert t.env["RECEIPTS_DATABASE_URL"].endswith("/receipts") and len(t.env["RECEIPTS_SECRET"]) >= 32
