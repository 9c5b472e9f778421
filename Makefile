# Two entry points do all the set-up on a fresh machine (see README "Try it locally"):
#   make demo   - install into .venv (+ Azurite with npm) and run the whole loop on 127.0.0.1
#   make test   - install into .venv (+ Azurite, checkov's own venv, systemd-analyze) and run every check
# and one for the loop inside a change:
#   make check  - ruff, mypy and the fast tests (kernel, units, workflows, contracts): ~1.5 minutes
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# checkov pins versions that conflict with the Azure SDKs, so it gets a venv of its own.
CHECKOV_VENV ?= .venv-checkov
CHECKOV_VERSION ?= 3.2.369
PYTEST_ARGS ?=
# Azurite (Microsoft's Azure Storage emulator, an npm package) for the local stand-ins' blobs and
# tables, pinned by emulators/azurite/package-lock.json and installed with npm ci (no scripts).
AZURITE_DIR := emulators/azurite
AZURITE := $(AZURITE_DIR)/node_modules/.installed
# make test runs pytest on this many processes (pytest-xdist; 0: one process): three and a half
# times the cores (7 on 2). Many tests wait on real processes over loopback (a 30 s outage, a
# kill -9 loop), and more workers keep both cores busy meanwhile; the suite also needs ~15
# minutes of CPU: see docs/local-development.md "Development" for what was measured on 2 cores
# (6 workers left the cores idle a fifth of the run; with 8, a test that measures answers under
# a flood of connections sometimes measured the machine instead).
# --dist loadgroup keeps tests that share an expensive fixture on one worker; tests/conftest.py
# starts the slow tests first and mixes the rest.
PYTEST_WORKERS ?= $(shell $(PYTHON) -c 'import os; print(7 * (os.cpu_count() or 1) // 2)')
# make check: the directories of the fast tests, without those marked slow, each property test
# at a tenth of its examples (tests/support/budget.py; make test runs every one in full).
CHECK_TESTS ?= tests/unit tests/functions tests/contract
CHECK_WORKERS ?= $(PYTEST_WORKERS)

.PHONY: demo test test-deps test-run check coverage lint typecheck bench install clean dist peer-suite peer-suite-ci

# Every virtual environment is made by scripts/install-venv: it checks $(PYTHON) (3.11+, with
# venv) before creating anything, says how to pick another (make PYTHON=python3.11 ...), and
# removes an environment whose installation failed.
INSTALL_VENV := MAKE_GOAL='$(or $(GOAL),$(MAKECMDGOALS),demo)' scripts/install-venv

# The VM package (this directory) and the local tools (emulators/) as editable installs, the
# Function App's requirements.txt, and the test tools.
$(BIN)/.installed: pyproject.toml emulators/pyproject.toml requirements.txt requirements-dev.txt
	@$(INSTALL_VENV) --builds-c '$(PYTHON)' '$(VENV)' '$@' -e . -e ./emulators \
		-r requirements.txt -r requirements-dev.txt

$(AZURITE): $(AZURITE_DIR)/package.json $(AZURITE_DIR)/package-lock.json
	scripts/ensure-system-tools node
	npm ci --prefix $(AZURITE_DIR) --ignore-scripts --no-audit --no-fund --loglevel=error
	touch $@

# --no-compile: pip would compile every module of checkov and its many dependencies (38 s of
# an install that takes 23 s without); the one scan the tests run compiles what it imports.
$(CHECKOV_VENV)/.installed: Makefile
	@$(INSTALL_VENV) '$(PYTHON)' '$(CHECKOV_VENV)' '$@' --no-compile 'checkov==$(CHECKOV_VERSION)'

install: $(BIN)/.installed $(AZURITE)

demo: $(BIN)/.installed $(AZURITE)
	$(BIN)/sebridge demo

# Both checks run, and either failing fails: a lint error never hides a format one.
lint: $(BIN)/.installed
	@status=0; \
	$(BIN)/ruff check . || status=1; \
	$(BIN)/ruff format --check . || status=1; \
	exit $$status

typecheck: $(BIN)/.installed
	$(BIN)/mypy

# Python's bytecode caches are written even where the environment says not to
# (PYTHONDONTWRITEBYTECODE): every worker and every child process the tests start would
# otherwise compile the project again (collection alone: 15 s of CPU per worker instead of 6).
# make test runs every property test in full, whatever the caller's environment says
# (tests/support/budget.py); make check sets the smaller budget.
PYTEST := env -u PYTHONDONTWRITEBYTECODE -u SEBRIDGE_TEST_BUDGET $(BIN)/pytest
CHECK_PYTEST := env -u PYTHONDONTWRITEBYTECODE SEBRIDGE_TEST_BUDGET=check $(BIN)/pytest

# What make test needs, made side by side (alone, on 2 cores: the test tools 37 s, Azurite 18 s,
# checkov 23 s).
test-deps: $(BIN)/.installed $(AZURITE) $(CHECKOV_VENV)/.installed

# ruff and mypy run beside the tests (scripts/beside), their output printed after pytest's.
test:
	@$(MAKE) --no-print-directory --jobs=3 test-deps GOAL=test
	scripts/ensure-system-tools
	scripts/beside '$(MAKE) --no-print-directory --jobs=2 lint typecheck' \
		$(MAKE) --no-print-directory test-run

# One process collects the tests first, which compiles the sources and rewrites the tests'
# asserts into __pycache__ once; the workers then read it. In a fresh clone, six workers doing
# it at once spent 13 s of CPU each, against 5 s with the cache. (A collection error shows in
# the run that follows.)
test-run:
	-@$(PYTEST) --collect-only -qq -p no:cacheprovider $(PYTEST_ARGS) > /dev/null
	SEBRIDGE_CHECKOV=$(CURDIR)/$(CHECKOV_VENV)/bin/checkov $(PYTEST) \
		--numprocesses $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

check: $(BIN)/.installed
	$(MAKE) --no-print-directory lint typecheck
	$(CHECK_PYTEST) --numprocesses $(CHECK_WORKERS) --dist loadgroup \
		-m "not slow" $(CHECK_TESTS)

# Line and branch coverage of the whole suite (pyproject.toml [tool.coverage]): every test, in
# parallel as make test runs them, and every process they start; about 20 minutes on 2 cores.
coverage: test-deps
	scripts/ensure-system-tools
	rm -rf .coverage-data && mkdir .coverage-data
	@status=0; SEBRIDGE_CHECKOV=$(CURDIR)/$(CHECKOV_VENV)/bin/checkov \
		$(PYTEST:$(BIN)/pytest=$(BIN)/coverage run -m pytest) --numprocesses $(PYTEST_WORKERS) \
		--dist loadgroup -p no:cacheprovider $(PYTEST_ARGS) || status=$$?; \
	$(BIN)/coverage combine --quiet && $(BIN)/coverage json --quiet -o .coverage-data/all.json \
		&& $(BIN)/python scripts/coverage_totals.py .coverage-data/all.json || status=1; \
	exit $$status

BENCHMARKS := forwarder_poll approval_latency e2e_latency servicebus_emulator fleet eventgrid_ingest drain_probe_flip burst

# Every benchmark in turn, each with its defaults (about 6 minutes on 2 cores); each prints its
# figures and exits 1 when it misses a target. One of them: make bench BENCHMARKS=fleet
bench: $(BIN)/.installed
	@for b in $(BENCHMARKS); do echo "== benchmarks/$$b.py"; $(BIN)/python benchmarks/$$b.py || exit 1; done

# The two deliverables: the VM wheel and the Function App zip, in dist/.
dist: $(BIN)/.installed
	$(BIN)/python scripts/build-dist

# azure-servicebus's own test suite (the installed version's sdist, cached in tests/peer/.cache)
# against the Service Bus emulator, with only its live-test harness replaced; prints passed,
# failed (emulator differs from Service Bus) and excluded (tests/peer/exclusions.toml).
peer-suite: $(BIN)/.installed
	$(BIN)/python tests/peer/run.py

# A representative subset (tests/peer/ci_subset.txt) bounded to 5 minutes of wall time;
# exits non-zero when a test fails or the bound is hit.
peer-suite-ci: $(BIN)/.installed
	timeout --kill-after=15 300 $(BIN)/python tests/peer/run.py --subset ci --timeout 60 --deadline 285

clean:
	rm -rf dist $(VENV) $(CHECKOV_VENV) $(AZURITE_DIR)/node_modules .pytest_cache .mypy_cache .ruff_cache .coverage-data
