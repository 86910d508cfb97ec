#!/usr/bin/env bash
# One device call: carried wheels (.whl: pydantic and deps, fla-core 0.6.0), then the GPU benchmarks.
# Writes $OUT/decode.json and prints the RESULTS.md table.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "${SITE:=/tmp/site}" .whl/*.whl || exit 1
export PYTHONPATH="$SITE:$PWD" FLA_DISABLE_BACKEND_DISPATCH=1
out="${OUT:-/tmp}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__)"
python3 -m pytest -q -p no:cacheprovider benchmarks/test_decode_gpu.py --benchmark-only \
  --benchmark-json="$out/decode.json" --benchmark-columns=median,rounds > "$out/decode.log" 2>&1 || tail -30 "$out/decode.log"
python3 benchmarks/report.py "$out/decode.json"
