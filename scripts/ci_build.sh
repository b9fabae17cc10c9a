#!/usr/bin/env bash
# A CI dataset-build step on packer's core install (no torch): install, pack, check the output.
#
#   scripts/ci_build.sh [INPUT] [OUT]      (defaults: data/sample.jsonl.gz out/ci)
#
# Any non-zero exit fails the job: 1 bad data or a failed check, 2 bad options. The JSON reports
# land beside OUT (OUT.pack.json, OUT.verify.json). Environment:
#   PYTHON           interpreter that makes the build's venv (default: python3); never installed into
#   SKIP_INSTALL=1   packer is already importable by PYTHON: run it there, install nothing
#   MAX_LEN          row length (default: 4096)
#   NUMBA_CACHE_DIR  where numba keeps its compiled kernels (default: .numba-cache); cache this
#                    directory between CI runs, keyed on the packer sources and the Python version
set -euo pipefail

INPUT=${1:-data/sample.jsonl.gz}
OUT=${2:-out/ci}
PYTHON=${PYTHON:-python3}
MAX_LEN=${MAX_LEN:-4096}
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-$PWD/.numba-cache}

if [ "${SKIP_INSTALL:-0}" != 1 ]; then
    # A fresh venv of its own, removed at exit: the caller's Python (the system's, or a venv with
    # an editable install) is never touched.
    VENV=$(mktemp -d "${TMPDIR:-/tmp}/packer-ci-venv.XXXXXX")
    trap 'rm -rf "$VENV"' EXIT
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet .   # the core install: no torch
    PYTHON=$VENV/bin/python
fi

mkdir -p "$(dirname "$OUT")"
"$PYTHON" -m packer pack "$INPUT" --output "$OUT" --max-len "$MAX_LEN" --overlength split \
    --overwrite --json >"$OUT.pack.json"
"$PYTHON" -m packer verify "$OUT" --input "$INPUT" --no-attention --json >"$OUT.verify.json"
echo "packed and verified $INPUT -> $OUT (reports: $OUT.pack.json, $OUT.verify.json)"
