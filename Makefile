# Two commands on a fresh machine: `make demo` and `make test`.
# Each creates .venv and installs the project into it the first time.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint protos schema clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mesolite demo

test: $(STAMP) lint
	$(PY) -m pytest

# The unit layer only (tests/conftest.py): pure, in-process, under 30 s.
test-fast: $(STAMP)
	$(PY) -m pytest -m unit -q

lint: $(STAMP)
	$(PY) scripts/gen_protos.py --check
	$(PY) scripts/gen_state_schema.py --check
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

protos: $(STAMP)
	$(PY) scripts/gen_protos.py

schema: $(STAMP)
	$(PY) scripts/gen_state_schema.py

clean:
	rm -rf $(VENV) work-dirs build *.egg-info
