#!/usr/bin/env bash
# The prepared device check (CUDA): on a fresh GPU machine, from the repo root,
# with only the working tree (and, where the image lacks them, the Python wheels that
# tools/gpu_wheels.sh put in .whl/):
#
#   OUT=/some/dir tools/gpu_check.sh        (default OUT: ./gpu-report)
#
# Through the device tool: here, `bash tools/gpu_wheels.sh` once (about 5 MB into .whl/); then
# run(command="bash tools/gpu_check.sh", carry=[".whl"], timeout_s=600): $OUT is the tool's
# folder, and what comes back is gpu_report.json, setup.log, build.log, pytest_gpu.log and
# pytest_gpu.xml. Options after the script name go to tools/gpu_check.py (--only
# PHASE... to rerun some bench phases, --budget-s, --tokens).
#
# 1. a venv over the image's own Python packages (--system-site-packages: numpy, pytest, ...;
#    no index is asked, the machine has no network), the carried wheels, and this checkout
#    installed editable without dependencies: about 30 s instead of `make .venv/.stamp-test`'s
#    downloads; the stamps are then touched so `make build` takes the venv as it is;
# 2. python tools/gpu_check.py: make build, the driver probe (it stops there,
#    with the reason, where no device is usable), pytest -m gpu, the GPU bench model and the
#    cuda-decode phases, each under its own deadline within a 540 s budget, rewriting
#    $OUT/gpu_report.json after every step.
#
# Exit status: 0 every step passed; 1 some step failed (see the report); 2 the venv could not
# be made; 3 no usable CUDA device; 4 the bench model could not be generated; 5 the check
# itself crashed (the report has the traceback).
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu-report}"
mkdir -p "$OUT"
PYTHON="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
(
  echo "== setup $(date -u +%FT%TZ) on $(uname -m), $($PYTHON --version 2>&1)"
  if [ ! -x .venv/bin/python ]; then
    timeout 120 "$PYTHON" -m venv --system-site-packages .venv || exit 2
    # The image's python3 may itself be a venv (/opt/torch/.venv): --system-site-packages
    # then reaches only its base interpreter, so its own site-packages go in by a .pth
    # (after ours: the carried wheels win).
    site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$PYTHON" -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' \
      >"$site/_colibri_image_site.pth" || exit 2
  fi
  # One at a time: a wheel this Python cannot take must not keep the others out.
  for wheel in .whl/*.whl; do
    [ -e "$wheel" ] || continue
    timeout 120 .venv/bin/python -m pip install -q --no-index --no-deps --no-cache-dir "$wheel" \
      || echo "warning: $wheel did not install"
  done
  timeout 180 .venv/bin/python -m pip install -q --no-index --no-deps --no-build-isolation -e . \
    || exit 2
  touch .venv/.stamp-runtime .venv/.stamp-build .venv/.stamp-test
  echo "== setup done $(date -u +%FT%TZ)"
) >"$OUT/setup.log" 2>&1
status=$?
if [ "$status" -ne 0 ]; then
  printf '{"schema": "colibri-gpu-check/1", "status": "stopped", "stopped_at": "setup", "reason": "the venv could not be made (exit %s): see setup.log"}\n' \
    "$status" >"$OUT/gpu_report.json"
  tail -5 "$OUT/setup.log"
  exit 2
fi
.venv/bin/python tools/gpu_check.py --out "$OUT" "$@"
status=$?
.venv/bin/python - "$OUT/gpu_report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"gpu_check: {r['status']}" + (f" at {r['stopped_at']}: {r['reason']}" if r.get("reason") else ""))
for name, step in r["steps"].items():
    print(f"  {name:14} {step['status']:9} {step['wall_s']:8.1f} s")
PY
exit "$status"
