# make serve  - set up .venv and serve the embedded default model on http://127.0.0.1:8000
# make test   - set up .venv and run ruff, mypy --strict and the whole pytest suite
#
# Stamps under .venv make a second run skip installation when pyproject.toml is unchanged.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
HYPOTHESIS_PROFILE ?= ci
export HYPOTHESIS_PROFILE

.PHONY: serve test lint typecheck pytest build oracle-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Runtime install: what `make serve` needs.
$(VENV)/.stamp-runtime: pyproject.toml | $(BIN)/python
	$(PY) -m pip install --quiet -e .
	touch $@

# Test install: runtime plus the test and dev extras.
$(VENV)/.stamp-test: pyproject.toml | $(BIN)/python
	$(PY) -m pip install --quiet -e '.[test,dev]'
	touch $@ $(VENV)/.stamp-runtime

# Compiled pieces (accelerated engine, web assets) are built here once they exist.
build:
	@if [ -f web/package.json ]; then \
	  if command -v npm >/dev/null 2>&1; then $(MAKE) --no-print-directory web/dist/index.html; \
	  else echo "make: npm not found; skipping the web dashboard build"; fi; \
	fi

web/dist/index.html: $(shell find web/src web/index.html web/package.json -type f 2>/dev/null)
	cd web && npm ci --no-audit --no-fund --silent && npm run build --silent

serve: $(VENV)/.stamp-runtime build
	$(BIN)/colibri serve

lint: $(VENV)/.stamp-test
	$(BIN)/ruff check .

typecheck: $(VENV)/.stamp-test
	$(PY) tools/typecheck_view.py >/dev/null
	cd build/typecheck && ../../$(BIN)/mypy --config-file ../../pyproject.toml -p colibri

pytest: $(VENV)/.stamp-test build
	$(BIN)/pytest

test: lint typecheck pytest

# Regenerate every oracle fixture with torch + transformers and fail if a committed byte differs.
oracle-check: $(VENV)/.stamp-test
	$(PY) -m pip install --quiet -e '.[oracle]'
	$(PY) -m colibri.fixtures.check

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
