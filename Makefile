# make serve  - set up .venv and serve the embedded default model on http://127.0.0.1:8000
# make test   - set up .venv and run ruff, mypy --strict, the whole pytest suite, the control
#               plane's tests again mypyc-compiled, and the web dashboard's tests (vitest; the
#               browser suite when Chromium is installed)
#
# Stamps under .venv make a second run skip installation when pyproject.toml is unchanged.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
HYPOTHESIS_PROFILE ?= ci
export HYPOTHESIS_PROFILE

.PHONY: serve test lint typecheck pytest pytest-compiled webtest build sanitize-test oracle-deps oracle-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# Runtime install: what `make serve` needs.
$(VENV)/.stamp-runtime: pyproject.toml | $(BIN)/python
	$(PY) -m pip install --quiet -e .
	touch $@

# Build install: runtime plus mypy, whose mypyc compiles the control plane.
$(VENV)/.stamp-build: pyproject.toml | $(BIN)/python
	$(PY) -m pip install --quiet -e '.[build]'
	touch $@ $(VENV)/.stamp-runtime

# Test install: runtime plus the test, dev and build extras.
$(VENV)/.stamp-test: pyproject.toml | $(BIN)/python
	$(PY) -m pip install --quiet -e '.[test,dev,build]'
	touch $@ $(VENV)/.stamp-runtime $(VENV)/.stamp-build

# Compiled pieces, each incremental (a stamp of its inputs; a second `make build` is quick):
# the C library (build/accelerated), the CUDA library where nvcc exists
# (build/accelerated/cuda), the mypyc control plane (build/mypyc), our bytecode, web assets.
# They are independent, so they build side by side (mypyc's C compilation is most of a fresh
# build): 76 -> 70 s on two busy cores, more where nvcc compiles beside mypyc.
BUILD_PARTS := build-native build-cuda build-control-plane build-bytecode build-web
.PHONY: $(BUILD_PARTS)

build: $(VENV)/.stamp-build
	@$(MAKE) --no-print-directory -j$(words $(BUILD_PARTS)) --output-sync=target $(BUILD_PARTS)

build-native: $(VENV)/.stamp-build
	@if [ -n "$$(find accelerated/csrc -name '*.c' 2>/dev/null)" ]; then \
	  $(PY) -m colibri.accelerated.native_build; \
	fi

build-cuda: $(VENV)/.stamp-build
	@if [ -n "$$(find accelerated/cuda -name '*.cu' 2>/dev/null)" ]; then \
	  $(PY) -m colibri.accelerated.cuda_build; \
	fi

build-control-plane: $(VENV)/.stamp-build
	@$(PY) -m colibri.control_plane_build

# Bytecode for our own modules, written even where PYTHONDONTWRITEBYTECODE is set (our
# development machines set it): each `colibri engine` process the suite starts (hundreds)
# would otherwise compile about 85 modules from source, 0.15 s of CPU every time.
build-bytecode: $(VENV)/.stamp-build
	@$(PY) -m compileall -q colibri reference accelerated server conformance spec >/dev/null

build-web: $(VENV)/.stamp-build
	@if [ -f web/package.json ]; then \
	  if command -v npm >/dev/null 2>&1; then $(MAKE) --no-print-directory web/dist/index.html; \
	  else tools/layer_skip.sh "web dashboard build" "npm not found" "Node 20 with npm"; fi; \
	fi

# The C library built with ASan + UBSan (build/accelerated/sanitize), and the tests marked
# `sanitize` (the loader's corrupt-input tests) run against it with the ASan runtime preloaded.
# Only the files that mark tests `sanitize` are collected: collecting the whole suite to
# deselect all but those took 10 of the step's 16 s.
SANITIZE_TESTS = $(shell grep -rlE 'pytest\.mark\.sanitize' tests --include='*.py' 2>/dev/null)
sanitize-test: $(VENV)/.stamp-test
	$(PY) -m colibri.accelerated.native_build --sanitize -- \
	  $(BIN)/pytest -m sanitize -p no:cacheprovider -q $(SANITIZE_TESTS)

web/dist/index.html: $(shell find web/src web/index.html web/package.json web/package-lock.json \
                       web/vite.config.ts web/tsconfig.json -type f 2>/dev/null)
	cd web && npm ci --no-audit --no-fund --silent && npm run build --silent

# Serving the default model runs the reference engine, interpreted: it needs the bytecode and
# the dashboard, and the C library for `--accelerated`; the mypyc control plane (most of a fresh
# build's time) and CUDA are built by `make build` when wanted.
SERVE_PARTS := build-native build-bytecode build-web
serve: $(VENV)/.stamp-build
	@$(MAKE) --no-print-directory -j$(words $(SERVE_PARTS)) --output-sync=target $(SERVE_PARTS)
	$(BIN)/colibri serve

lint: $(VENV)/.stamp-test
	$(BIN)/ruff check .

typecheck: $(VENV)/.stamp-test
	$(PY) tools/typecheck_view.py >/dev/null
	cd build/typecheck && ../../$(BIN)/mypy --config-file ../../pyproject.toml -p colibri

# Where a C compiler exists `make build` has built the accelerated library, so the suite
# requires it (a missing library fails the run instead of skipping the accelerated tests).
# One pytest worker per core, at most 4 (each worker starts engines and servers of its own);
# whole files per worker, so a module's servers and cached verdicts are built once.
PYTEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)

pytest: $(VENV)/.stamp-test build
	@require=$$($(PY) -c 'from colibri.accelerated.native_build import compiler; print(int(compiler() is not None))'); \
	if [ "$$require" = 0 ]; then \
	  tools/layer_skip.sh "accelerated engine tests" "no C compiler" "a C compiler (gcc)" || exit 1; \
	fi; \
	COLIBRI_REQUIRE_ACCELERATED=$$require $(BIN)/pytest -n $(PYTEST_JOBS) --dist loadfile

# The control plane's tests again with it mypyc-compiled (what --accelerated processes run);
# skipped, loudly, where `make build` could not compile it (no C compiler).
COMPILED_TESTS := tests/engine tests/text/test_submit_grammar.py tests/text/test_tokenizer.py
pytest-compiled: $(VENV)/.stamp-test build
	@if $(PY) -c 'from colibri import control_plane as c; c.check_current(c.read_build())'; then \
	  COLIBRI_CONTROL_PLANE=compiled $(BIN)/pytest -q -n $(PYTEST_JOBS) --dist loadfile $(COMPILED_TESTS); \
	else \
	  tools/layer_skip.sh "compiled control plane tests" "make build compiled no control plane" \
	    "a C compiler (gcc)"; \
	fi

# The dashboard: vitest unit tests, then the browser suite (web/e2e) against a real
# `colibri serve` in headless Chromium. No Chromium means a loud skip, never a silent pass.
CHROMIUM ?= $(shell command -v chromium 2>/dev/null)

webtest: $(VENV)/.stamp-runtime build
	@set -e; \
	if [ ! -f web/package.json ]; then exit 0; fi; \
	if ! command -v npm >/dev/null 2>&1; then \
	  tools/layer_skip.sh "web dashboard tests" "npm not found" "Node 20 with npm"; \
	  exit 0; \
	fi; \
	cd web; [ -d node_modules ] || npm ci --no-audit --no-fund --silent; \
	npx vitest run; \
	if [ -n "$(CHROMIUM)" ]; then \
	  CHROMIUM="$(CHROMIUM)" COLIBRI_BIN="$(CURDIR)/$(BIN)/colibri" npm run --silent e2e; \
	else \
	  cd ..; tools/layer_skip.sh "browser e2e tests" "chromium not found" \
	    "Debian's chromium (apt-get install -y chromium; .ci/run installs it)"; \
	fi

# Layers that cannot run here are skipped and listed at the end (tools/layer_skip.sh); under
# CI=true each such layer fails the run instead, naming what to install.
test: skip-ledger lint typecheck pytest pytest-compiled webtest
	@tools/layer_skip.sh --summary

.PHONY: skip-ledger
skip-ledger:
	@tools/layer_skip.sh --reset

# The oracle extra. torch comes only as the CPU wheel on this machine's disk: pip's configured
# find-links (`pip config list`, PIP_FIND_LINKS) with --no-index, so no index is ever asked and
# a CUDA build cannot be pulled; with torch in place, the rest of the extra comes from the index.
# It needs the runtime install only (.ci/run builds it in a venv of its own, beside make test).
$(VENV)/.stamp-oracle: pyproject.toml $(VENV)/.stamp-runtime
	@$(PY) -m pip install --quiet --no-index --no-deps 'torch==2.13.0' || { \
	  echo "make: no local torch==2.13.0 wheel on pip's find-links; not installing one from an index (it could be a CUDA build)" >&2; \
	  exit 1; }
	@$(PY) -c 'import sys, torch; sys.exit(f"make: torch {torch.__version__} is a CUDA build; the oracle needs the CPU wheel" if torch.version.cuda else 0)'
	$(PY) -m pip install --quiet -e '.[oracle]'
	touch $@

oracle-deps: $(VENV)/.stamp-oracle

# Regenerate every oracle fixture with torch + transformers and compare it with the committed
# files: weights, configs, tokenizers and ids byte for byte, logits and margins within the
# kind-(b) tolerance (spec/model.md §15; fixtures/check.py says which is which).
oracle-check: $(VENV)/.stamp-oracle
	$(PY) -m colibri.fixtures.check

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache web/dist web/test-artifacts
