"""docker-compose.yml cannot run here (no Docker engine): check that it says what the CLI and config accept."""

import fnmatch
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet
from support.install import BUILD_INPUTS

from proxy_addon.admin.server import parse_listen
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


# -- Prometheus and Grafana: what `docker compose up` gives an operator ------------------------------------------


def _mounts(service: dict) -> dict[str, str]:
    """container path -> repository path, for the service's bind mounts of repository files."""
    return {target: source for source, target, *_ in (v.split(":") for v in service["volumes"]) if source.startswith("./")}


def test_prometheus_and_grafana_run_with_what_the_repository_provisions(compose):
    prometheus, grafana = compose["services"]["prometheus"], compose["services"]["grafana"]
    for service in (prometheus, grafana):
        for target, source in _mounts(service).items():
            assert (REPO / source).exists(), f"{source} (mounted at {target}) is not in the repository"
    assert _mounts(prometheus) == {
        "/etc/prometheus/prometheus.yml": "./deploy/prometheus/prometheus.yml",
        "/etc/prometheus/alerts.yml": "./deploy/prometheus/alerts.yml",  # beside it: rule_files says alerts.yml
    }
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    assert _mounts(grafana) == {
        "/etc/grafana/provisioning": "./deploy/grafana/provisioning",
        "/etc/grafana/dashboards": "./deploy/grafana/dashboards",  # where the provisioned provider looks
    }
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith("/etc/grafana/dashboards/") and (REPO / "deploy/grafana/dashboards" / home.rsplit("/", 1)[1]).is_file()
    for service in (prometheus, grafana):  # on the host's loopback only, as the proxies are
        assert all(port.startswith("127.0.0.1:") for port in service["ports"])


@pytest.mark.parametrize("service", ["proxy-1", "proxy-2", "reconcile"])
def test_prometheus_scrapes_each_process_where_it_serves_metrics_with_the_token(compose, service, monkeypatch):
    """Each replica serves its admin server (`receipts_admin_listen`), and the reconcile worker its own
    (`--admin-listen`: its verdicts are counted there), on the port Prometheus scrapes; that needs the token,
    which compose passes to them and, as a secret, to Prometheus."""
    scrape = yaml.safe_load((REPO / "deploy/prometheus/prometheus.yml").read_text())
    [job] = scrape["scrape_configs"]
    [targets] = [c["targets"] for c in job["static_configs"]]
    proxy = compose["services"][service]
    args = build_parser().parse_args(proxy["command"])
    if service == "reconcile":
        host, port = args.admin_listen
    else:
        [listen] = [s.split("=", 1)[1] for s in args.set if s.startswith("receipts_admin_listen=")]
        host, port = parse_listen(listen)
    assert f"{service}:{port}" in targets
    assert "RECEIPTS_ADMIN_TOKEN" in proxy["environment"] and proxy["environment"]["RECEIPTS_SECRET"]
    secret = job["authorization"]["credentials_file"].removeprefix("/run/secrets/")
    assert secret in compose["services"]["prometheus"]["secrets"]
    assert compose["secrets"][secret] == {"environment": "RECEIPTS_ADMIN_TOKEN"}
    config = load_config(REPO / "config.yaml")
    monkeypatch.delenv("RECEIPTS_ADMIN_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="RECEIPTS_ADMIN_TOKEN"):  # why compose refuses to start without it
        admin_settings(config, listen_host=host, listen_port=port, enabled=True)
    monkeypatch.setenv("RECEIPTS_ADMIN_TOKEN", "0123456789abcdef")
    assert admin_settings(config, listen_host=host, listen_port=port, enabled=True).listen_port == port


# -- the Dockerfile: read, not built (no Docker engine here) --------------------------------------------------


@dataclass
class Stage:
    """One FROM ... stage of a Dockerfile: its base image, its name, and its instructions in order."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]]  # (INSTRUCTION, its arguments), continuation lines joined

    def args(self, instruction: str) -> list[str]:
        return [args for name, args in self.instructions if name == instruction]


def dockerfile_stages(text: str) -> list[Stage]:
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    stages: list[Stage] = []
    for line in re.sub(r"\\\n\s*", " ", "\n".join(lines)).splitlines():
        if not line.strip():
            continue
        instruction, _, args = line.strip().partition(" ")
        if instruction.upper() == "FROM":
            base, _, name = args.partition(" AS ")
            stages.append(Stage(base.strip(), name.strip() or None, []))
        else:
            stages[-1].instructions.append((instruction.upper(), args.strip()))
    return stages


def copied_sources(stage: Stage) -> set[str]:
    """What the stage copies from the build context (not from another stage), as paths in it."""
    sources = set()
    for args in stage.args("COPY"):
        words = [w for w in args.split() if not w.startswith("--")]
        if not any(w.startswith("--from=") for w in args.split()):
            sources |= {w.removeprefix("./").rstrip("/") for w in words[:-1]}
    return sources


@pytest.fixture(scope="module")
def dockerfile() -> list[Stage]:
    return dockerfile_stages((REPO / "Dockerfile").read_text())


def test_dockerfile_builds_the_wheel_from_what_a_build_reads(dockerfile):
    """The build stage copies what the wheel test builds from (support/install.py), nothing less, and builds the
    wheel: migrations/ and config.yaml reach the image through it."""
    build = dockerfile[0]
    assert copied_sources(build) == set(BUILD_INPUTS)
    assert any(re.match(r"pip wheel\b.*--no-deps.*--wheel-dir /wheels \.$", run) for run in build.args("RUN"))


def test_the_image_installs_the_wheel_alone_and_runs_as_a_user(dockerfile):
    build, image = dockerfile
    assert len(dockerfile) == 2 and build.name
    assert image.args("COPY") == [f"--from={build.name} /wheels /tmp/wheels"]  # no source tree in the image
    [install] = [run for run in image.args("RUN") if "pip install" in run]
    assert "/tmp/wheels/*.whl" in install and " -e " not in install and "--editable" not in install
    [user] = image.args("USER")
    assert user not in ("root", "0") and f"useradd --create-home {user}" in install
    for stage in dockerfile:  # the Python the package requires
        python = re.fullmatch(r"python:(\d+\.\d+)-slim", stage.base)
        assert python and python.group(1) in SpecifierSet(_pyproject()["project"]["requires-python"])
    assert image.args("ENTRYPOINT") == ['["receipts"]']


def test_the_image_s_config_is_the_installed_default_where_compose_mounts_its_own(dockerfile, compose):
    """`receipts init`, run in the image as its user, writes the config its CMD and every service name: the
    wheel's default config, unless docker-compose.yml mounts ./config.yaml over it."""
    image = dockerfile[-1]
    instructions = [name for name, _ in image.instructions]
    init = next(args for name, args in image.instructions if name == "RUN" and args.startswith("receipts init"))
    assert instructions.index("USER") < image.instructions.index(("RUN", init))
    written = build_parser().parse_args(init.split()[1:]).config
    assert build_parser().parse_args(json.loads(image.args("CMD")[0])).config == written == "/app/config.yaml"
    [user] = image.args("USER")
    assert image.args("WORKDIR") == ["/app"] and f"chown {user} /app" in " ".join(image.args("RUN"))
    assert compose["x-receipts"]["build"] == "."
    assert f"./config.yaml:{written}:ro" in compose["x-receipts"]["volumes"]


def test_the_build_context_keeps_what_a_build_reads():
    ignored = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    assert ".venv" in ignored and ".git" in ignored
    assert not [(name, pattern) for name in BUILD_INPUTS for pattern in ignored if fnmatch.fnmatch(name, pattern)]


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


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
