# make serve  - set up .venv and serve the embedded default model on http://127.0.0.1:8000
# make test   - set up .venv and run ruff, mypy --strict, the whole pytest suite and the web
#               dashboard's tests (vitest; the browser suite when Chromium is installed)
#
# Stamps under .venv make a second run skip installation when pyproject.toml is unchanged.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
HYPOTHESIS_PROFILE ?= ci
export HYPOTHESIS_PROFILE

.PHONY: serve test lint typecheck pytest webtest build oracle-check clean

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

web/dist/index.html: $(shell find web/src web/index.html web/package.json web/package-lock.json \
                       web/vite.config.ts web/tsconfig.json -type f 2>/dev/null)
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

# The dashboard: vitest unit tests, then the browser suite (web/e2e) against a real
# `colibri serve` in headless Chromium. No Chromium means a loud skip, never a silent pass.
CHROMIUM ?= $(shell command -v chromium 2>/dev/null)

webtest: $(VENV)/.stamp-runtime build
	@set -e; \
	if [ ! -f web/package.json ]; then exit 0; fi; \
	if ! command -v npm >/dev/null 2>&1; then \
	  echo "########################################################################"; \
	  echo "## make webtest: npm not found -- SKIPPED the web dashboard tests     ##"; \
	  echo "########################################################################"; \
	  exit 0; \
	fi; \
	cd web; [ -d node_modules ] || npm ci --no-audit --no-fund --silent; \
	npx vitest run; \
	if [ -n "$(CHROMIUM)" ]; then \
	  CHROMIUM="$(CHROMIUM)" COLIBRI_BIN="$(CURDIR)/$(BIN)/colibri" npm run --silent e2e; \
	else \
	  echo "########################################################################"; \
	  echo "## make webtest: chromium not found -- SKIPPED the browser e2e tests  ##"; \
	  echo "## (apt-get install -y chromium; .ci/run installs it)                 ##"; \
	  echo "########################################################################"; \
	fi

test: lint typecheck pytest webtest

# Regenerate every oracle fixture with torch + transformers and fail if a committed byte differs.
oracle-check: $(VENV)/.stamp-test
	$(PY) -m pip install --quiet -e '.[oracle]'
	$(PY) -m colibri.fixtures.check

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache web/dist web/test-artifacts
