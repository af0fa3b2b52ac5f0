# The two commands the README opens with. Both build the virtual environment first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# Each `make demo` is a new run directory, so running it again never meets a finished run.
demo: $(STAMP)
	$(PY) -m thrifty demo --out runs/demo-$$(date +%Y%m%d-%H%M%S) $(ARGS)

test: $(STAMP)
	$(PY) -m ruff check src tests benchmarks examples
	$(PY) -m mypy
	$(PY) -m pytest -q -m "not slow" $(ARGS)

lint: $(STAMP)
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m mypy

bench: $(STAMP)
	$(PY) benchmarks/overhead.py
	$(PY) benchmarks/instrumentation.py
	$(PY) benchmarks/checkpoint.py

clean:
	rm -rf $(VENV) runs build src/*.egg-info
