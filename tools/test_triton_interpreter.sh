#!/usr/bin/env bash
# Runs the Triton-interpreter kernel tests (TRITON_INTERPRET=1, CPU) against one Triton release.
# Usage: bash tools/test_triton_interpreter.sh VERSION [pytest args...]   e.g. 3.6.0 or 3.9.0
# The venv .venv-triton-VERSION in the repo root sees the system site-packages (torch, pytest, the editable
# linrnn install) and adds only triton==VERSION on top, so it is cheap to create and is reused on later runs.
set -euo pipefail

# An exact release (3.9.0, not 3.9), so that the venv's name and the version check below match it
if [ $# -lt 1 ] || ! [[ $1 =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
    echo "usage: bash tools/test_triton_interpreter.sh VERSION [pytest args...]   (VERSION like 3.9.0)" >&2
    exit 2
fi
version=$1
shift
cd "$(dirname "$0")/.."
venv=".venv-triton-$version"

if [ ! -x "$venv/bin/python" ]; then
    # --without-pip saves ~7 s: the system pip, seen through the system site-packages, installs into the venv
    "${PYTHON:-python3}" -m venv --system-site-packages --without-pip "$venv"
fi
py="$venv/bin/python"

packages=("triton==$version")
# Triton < 3.7's interpreter breaks on numpy >= 2.4 (triton-lang/triton#9171)
if [ "$(printf '%s\n' "$version" 3.7 | sort -V | head -n 1)" != 3.7 ]; then
    packages+=("numpy<2.4")
fi
# --no-deps: triton needs nothing on Python >= 3.10, and this keeps pip off the system packages
"$py" -m pip install --quiet --no-deps "${packages[@]}"

"$py" - "$version" <<'EOF'
import sys

import numpy
import torch
import triton

print(f"torch {torch.__version__}, triton {triton.__version__}, numpy {numpy.__version__} ({sys.prefix})")
if triton.__version__ != sys.argv[1]:
    sys.exit(f"expected triton {sys.argv[1]}, got {triton.__version__} from {triton.__file__}")
EOF

if [ -n "${TRITON_VENV_ONLY:-}" ]; then exit 0; fi  # set up the venv only (.ci/run, before its parallel checks)
export TRITON_INTERPRET=1
exec "$py" -m pytest tests/kernels/test_triton_chunk.py tests/kernels/test_triton_fused_recurrent.py \
    tests/kernels/test_triton_tiles.py tests/kernels/test_validation.py tests/kernels/test_short_conv.py \
    tests/kernels/test_fused.py tests/kernels/test_linear.py tests/kernels/test_greedy.py "$@"
