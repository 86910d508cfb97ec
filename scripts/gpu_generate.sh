#!/usr/bin/env bash
# One device call: the decoding benchmark (benchmarks/test_generate_gpu.py) and its RESULTS.md table.
# Carry .whl (pydantic and its dependencies, einops, fla-core 0.6.0 and flash-linear-attention 0.6.0; transformers
# is on the machine) and .triton_cache.tgz when there is one.
# Usage: bash scripts/gpu_generate.sh [more pytest arguments]; GENERATE_BENCH_MODELS, GENERATE_BENCH_SETTINGS (the
# test module's docstring), GENERATE_BENCH_SECONDS (default 540) bounds the run, and no test starts in its last
# GENERATE_BENCH_MARGIN seconds (default 120). Writes $OUT/generate.json, $OUT/generate.log and
# $OUT/triton_cache.tgz.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "${SITE:=/tmp/site}" .whl/*.whl || exit 1
out="${OUT:-/tmp}"
export PYTHONPATH="$SITE:$PWD" FLA_DISABLE_BACKEND_DISPATCH=1 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR="$PWD/.triton_cache" TRITON_CACHE_AUTOTUNING=1 TRITON_STORE_BINARY_ONLY=1
mkdir -p "$TRITON_CACHE_DIR"
if [ -f .triton_cache.tgz ]; then tar xzf .triton_cache.tgz -C "$TRITON_CACHE_DIR"; fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
seconds="${GENERATE_BENCH_SECONDS:-540}"
export GENERATE_BENCH_DEADLINE=$(($(date +%s) + seconds - ${GENERATE_BENCH_MARGIN:-120}))  # no test starts later
timeout -k 20 "$seconds" python3 -m pytest -q -p no:cacheprovider benchmarks/test_generate_gpu.py \
  --benchmark-only --benchmark-json="$out/generate.json" --benchmark-columns=median,rounds "$@" > "$out/generate.log" 2>&1 \
  || tail -40 "$out/generate.log"
python3 benchmarks/report.py "$out/generate.json" || echo "no benchmark results"
bash scripts/pack_triton_cache.sh "$TRITON_CACHE_DIR" "$out/triton_cache.tgz"
