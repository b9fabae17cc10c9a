#!/usr/bin/env bash
# Builds the virtualenv that scripts/bench_tokenize.py --axolotl runs axolotl's preprocessing in:
# axolotl 0.19.0 with torch's CPU build, kept apart from packer's .venv (axolotl pins its own
# transformers, datasets and TRL). Does nothing when the virtualenv is already built. About
# 4.3 GB; 5 to 8 minutes on a 2-core machine (with and without pip's cache), no CUDA packages.
#
#   scripts/axolotl_venv.sh [DIR]        # default /work/venvs/axolotl
#   TORCH_INDEX=https://download.pytorch.org/whl/cpu scripts/axolotl_venv.sh
#
# torch is pinned to 2.13.0 (the newest axolotl 0.19.0 allows): any looser torch requirement lets
# pip pick torch's CUDA build and its CUDA packages. Where pip's indexes give the CUDA build of
# torch 2.13.0 too (PyPI on Linux does), TORCH_INDEX names PyTorch's CPU index.
set -euo pipefail
DIR=${1:-/work/venvs/axolotl}
PYTHON=${PYTHON:-python3}
AXOLOTL_PIN=axolotl==0.19.0
TORCH_PIN=torch==2.13.0
if [ -f "$DIR/.installed" ]; then
    echo "$DIR: already built ($("$DIR/bin/python" -c 'import axolotl; print("axolotl", axolotl.__version__)'))"
    exit 0
fi
"$PYTHON" -m venv "$DIR"
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "$TORCH_PIN" >"$constraints"
"$DIR/bin/pip" install -q ${TORCH_INDEX:+--index-url "$TORCH_INDEX"} "$TORCH_PIN"
"$DIR/bin/pip" install -q -c "$constraints" "$AXOLOTL_PIN"
"$DIR/bin/python" -c "import axolotl.cli.preprocess"  # axolotl preprocess imports here
touch "$DIR/.installed"
echo "$DIR: built ($("$DIR/bin/python" -c 'import axolotl; print("axolotl", axolotl.__version__)'))"
