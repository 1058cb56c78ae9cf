# Two commands for a newcomer: `make run` (set up, migrate, start the proxy on SQLite) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= config.yaml
STAMP := $(VENV)/.installed

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
	$(VENV)/bin/receipts proxy --config $(CONFIG)

test: $(STAMP)
	scripts/ensure-postgres
	scripts/ensure-chromium
	scripts/ensure-faketime
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) receipts.db receipts.db-wal receipts.db-shm
