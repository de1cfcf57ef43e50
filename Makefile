# Two commands on a fresh machine: `make demo` and `make test`.
# Each creates .venv and installs the project into it the first time.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYMESOS := .venv-pymesos/bin/python

.PHONY: demo test test-fast shim lint protos schema sdk-reference clean mutation pymesos-venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	$(MAKE) --no-print-directory $(SHIM)
	touch $(STAMP)

# The supervisor's C exec helper (agent/spawn_shim.c): static where `cc -static` links,
# else dynamic; with no C compiler none, and the supervisor uses its /bin/sh shim and
# setpriv (so this never fails).
SHIM := agent/spawn_shim
SHIM_CFLAGS := -O2 -Wall -Wextra -Werror
$(SHIM): agent/spawn_shim.c
	@rm -f $@
	@$(CC) $(SHIM_CFLAGS) -static -o $@ $< 2>/dev/null || $(CC) $(SHIM_CFLAGS) -o $@ $< \
		|| echo "no C compiler: the supervisor spawns through /bin/sh and setpriv"

shim: $(SHIM)

demo: $(STAMP) $(SHIM)
	$(VENV)/bin/mesolite demo

test: $(STAMP) $(SHIM) lint $(PYMESOS)
	$(PY) -m pytest

# Unmodified pymesos 0.3.15 in a venv of its own (Python 3.10, or this Python with
# http-parser's C regenerated): tests/test_mesos_pymesos.py runs Mesos frameworks with it.
$(PYMESOS): scripts/pymesos_venv.py
	$(PYTHON) scripts/pymesos_venv.py .venv-pymesos
	touch $(PYMESOS)

pymesos-venv: $(PYMESOS)

# The unit layer only (tests/conftest.py), less its few slow tests: under 30 s.
test-fast: $(STAMP) $(SHIM)
	$(PY) -m pytest -m "unit and not slow" -q

lint: $(STAMP)
	$(PY) scripts/gen_protos.py --check
	$(PY) scripts/gen_state_schema.py --check
	$(PY) scripts/gen_sdk_reference.py --check
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

# Mutation testing of the allocator core (master/allocator.py, role_tree.py,
# fair_share.py, policies/, and issue 18's fair_levels.py, preemption.py, demand.py,
# preemptions.py; configured in pyproject.toml [tool.mutmut]). Slow: 30 minutes or
# more on 2 cores, so it is not part of `make test`. Prints the
# score per file and every survivor not reviewed as equivalent
# (docs/mutation/equivalent.md); fails if there is one.
MUTATION_JOBS ?= 2
mutation: $(STAMP)
	rm -rf mutants
	MESOLITE_HYPOTHESIS_PROFILE=mutation nice -n 10 $(VENV)/bin/mutmut run --max-children $(MUTATION_JOBS) > mutants.log 2>&1 \
		|| (tail -c 2000 mutants.log; exit 1)
	$(PY) scripts/mutation_report.py --equivalent docs/mutation/equivalent.md \
		--survivors docs/mutation/survivors.txt

protos: $(STAMP)
	$(PY) scripts/gen_protos.py

schema: $(STAMP)
	$(PY) scripts/gen_state_schema.py

sdk-reference: $(STAMP)
	$(PY) scripts/gen_sdk_reference.py

clean:
	rm -rf $(VENV) .venv-pymesos work-dirs build $(SHIM) *.egg-info mutants mutants.log
