#!/bin/sh
# A test layer that cannot run on this machine: `tools/layer_skip.sh LAYER WHY INSTALL`.
#
# Under CI=true a missing tool is a failure: CI promises every layer of `make test`, and a
# layer that vanishes from a green run claims more than was tested. Elsewhere the layer is
# skipped, said loudly now and once more in the summary at the end of `make test`
# (`tools/layer_skip.sh --summary`), which reads the ledger this script appends to.
set -eu
ledger="${COLIBRI_SKIP_LEDGER:-build/skipped-layers.txt}"

case "${1:-}" in
  --reset)
    rm -f "$ledger"
    exit 0 ;;
  --summary)
    if [ -s "$ledger" ]; then
      echo "########################################################################"
      echo "## make test: these layers were SKIPPED on this machine:"
      sed 's/^/##   /' "$ledger"
      echo "########################################################################"
    else
      echo "make test: every layer ran (none skipped)"
    fi
    exit 0 ;;
esac

if [ $# -ne 3 ]; then
  echo "usage: $0 LAYER WHY INSTALL | --reset | --summary" >&2
  exit 2
fi
layer=$1 why=$2 install=$3
if [ "${CI:-}" = "true" ]; then
  echo "ci: $layer cannot run: $why -- install $install (CI=true: no layer may be skipped)" >&2
  exit 1
fi
echo "## $layer: SKIPPED ($why; install $install) ##"
mkdir -p "$(dirname "$ledger")"
echo "$layer: $why (install $install)" >>"$ledger"
