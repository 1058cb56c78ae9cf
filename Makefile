# Two commands for a newcomer: `make run` (set up, migrate, start the proxy on SQLite) and `make test`.
# make run PORT=8090 CONFIG=path/to/config.yaml: another port, another config (paths in it are relative to it).
VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= config.yaml
PORT ?= 8080
STAMP := $(VENV)/.installed
# The suite waits on processes and servers more than it computes: one pytest worker more than the cores.
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
# Python compiles each module once and keeps its bytecode: where the environment says not to, every process the
# suite starts (proxies, CLI commands, workers) compiled the project again, and pytest rewrote every test module.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test venv migrate clean

$(PY):
	@py=$$(scripts/find-python) && $$py -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

migrate: $(STAMP)
	$(VENV)/bin/receipts db upgrade --config $(CONFIG)

run: migrate
	@echo "receipts: in the agent's shell, run: eval \"\$$($(abspath $(VENV))/bin/receipts env --listen-port $(PORT))\""
	$(VENV)/bin/receipts proxy --config $(CONFIG) --listen-port $(PORT)

test: $(STAMP)
	scripts/ensure-postgres
	scripts/ensure-chromium
	scripts/ensure-prometheus
	scripts/ensure-faketime
	scripts/ensure-azurite
	scripts/ensure-json-server
	scripts/ensure-openapi-docs
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) receipts.db receipts.db-wal receipts.db-shm
