#!/usr/bin/env bash
# Fill .whl/ with the wheels tools/gpu_check.sh installs on the GPU machine, whose image (no
# network; Python 3.12) lacks or has too old: the versions this checkout's .venv runs, for
# cp312 x86-64.
# Run here, then carry `.whl` with the device call. .whl/ is kept out of git.
set -eu
cd "$(dirname "$0")/.."
exclude="$(git rev-parse --git-path info/exclude)"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
mkdir -p .whl
pins=$(.venv/bin/python - <<'PY'
import importlib.metadata as m
# setuptools: the editable install builds with the venv's own (pyproject's SPDX license
# string needs setuptools >= 77, newer than some images carry).
names = ["setuptools", "syrupy", "tornado", "jsonschema", "jsonschema-specifications",
         "referencing", "rpds-py", "llguidance", "gguf"]
print(" ".join(f"{n}=={m.version(n)}" for n in names))
PY
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl $pins
ls -la .whl
