#!/usr/bin/env bash
# One device call: install carried wheels, run the whole suite (GPU-marked tests, Triton kernels compiled on CUDA).
# Usage (device tool): bash experiments/gpu_check.sh [test paths and pytest options; default: tests]   with .whl
# carried (pydantic and its deps for Python 3.12).
set -uo pipefail
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "${SITE:=/tmp/site}" .whl/*.whl || exit 1
  export PYTHONPATH="$SITE"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
# everything (GPU-marked tests and the Triton kernels compiled), or the test paths and options given
python3 -m pytest -q -p no:cacheprovider "${@:-tests}"
