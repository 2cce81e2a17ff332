VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint format bench typecheck clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tether demo

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples lint
	$(VENV)/bin/ruff format --check src tests bench examples lint
	$(VENV)/bin/lint-imports --no-logo

format: $(STAMP)
	$(VENV)/bin/ruff check --fix src tests bench examples lint
	$(VENV)/bin/ruff format src tests bench examples lint

typecheck: $(STAMP)
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) bench/turns.py
	$(PY) bench/turns_sqlite.py --turns 100,1000,10000
	$(PY) bench/turns_postgres.py --turns 100,1000
	$(PY) bench/turn_anatomy.py
	$(PY) bench/concurrency.py
	$(PY) bench/listing.py
	$(PY) bench/import_time.py
	$(PY) bench/tracing.py
	$(PY) bench/journal_bytes.py --pg postgresql://root@127.0.0.1:5432/test
	$(PY) bench/load.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache .grimp_cache
