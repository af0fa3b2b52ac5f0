# The two commands the README opens with. Both build the virtual environment first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CORE := $(VENV)/.core-stamp
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint bench clean chromium postgresql

# thrifty and its core (torch, numpy, rich, tomli-w): what the demo and `thrifty` need.
$(CORE): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e .
	touch $(CORE)

# What the tests, the linters and the benchmarks need besides: every extra thrifty integrates.
$(STAMP): $(CORE)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# Each `make demo` is a new run directory, so running it again never meets a finished run.
demo: $(CORE)
	$(PY) -m thrifty demo --out runs/demo-$$(date +%Y%m%d-%H%M%S) $(ARGS)
	@echo "thrifty is $(VENV)/bin/thrifty: 'source $(VENV)/bin/activate' puts it on your PATH"

# The report's browser test drives Debian's Chromium: installed here where apt-get can (as root);
# elsewhere the test is skipped and says why.
chromium:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || \
	  echo "no chromium (needs apt-get as root): the report's browser test will be skipped"

# The sweep's PostgreSQL test starts a throwaway server with Debian's initdb and pg_ctl: installed
# here where apt-get can (as root); elsewhere the test is skipped and says why.
postgresql:
	@command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    apt-get update -qq && apt-get install -y -qq postgresql >/dev/null; } || \
	  echo "no PostgreSQL (needs apt-get as root): the sweep's PostgreSQL test will be skipped"

test: $(STAMP) chromium postgresql
	$(PY) -m ruff check src tests benchmarks examples
	$(PY) -m mypy
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q -m "not slow" -n 2 --dist worksteal $(ARGS)

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

bench: $(STAMP)
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/instrumentation.py
	$(PY) benchmarks/checkpoint.py

clean:
	rm -rf $(VENV) runs build src/*.egg-info
