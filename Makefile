# Two commands on a fresh machine: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: demo test lint env clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and pinned: the local CPU wheel. Later installs see it satisfied.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

env: $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check posenc tests benchmarks
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

demo: $(STAMP)
	$(BIN)/posenc compare --config configs/compare.yaml

lint: $(STAMP)
	$(BIN)/ruff check posenc tests benchmarks
	$(BIN)/ruff format --check posenc tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache
