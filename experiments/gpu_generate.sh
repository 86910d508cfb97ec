#!/usr/bin/env bash
# One device call: the decoding benchmark (benchmarks/test_generate_gpu.py) and its RESULTS.md table.
# Carry .whl (pydantic and its dependencies, einops, fla-core 0.6.0 and flash-linear-attention 0.6.0; transformers
# is on the machine) and .triton_cache.tgz when there is one.
# Usage: bash experiments/gpu_generate.sh [more pytest arguments]; GENERATE_BENCH_MODELS, GENERATE_BENCH_SETTINGS (the
# test module's docstring), GENERATE_BENCH_SECONDS (default 540) bounds the run, and no test starts in its last
# GENERATE_BENCH_MARGIN seconds (default 120). Writes $OUT/generate.json, $OUT/generate.log and
# $OUT/triton_cache.tgz.
set -uo pipefail
source experiments/device_env.sh  # wheels, PYTHONPATH, Triton cache, $out
seconds="${GENERATE_BENCH_SECONDS:-540}"
export GENERATE_BENCH_DEADLINE=$(($(date +%s) + seconds - ${GENERATE_BENCH_MARGIN:-120}))  # no test starts later
timeout -k 20 "$seconds" python3 -m pytest -q -p no:cacheprovider benchmarks/test_generate_gpu.py \
  --benchmark-only --benchmark-json="$out/generate.json" --benchmark-columns=median,rounds "$@" > "$out/generate.log" 2>&1 \
  || tail -40 "$out/generate.log"
python3 benchmarks/report.py "$out/generate.json" || echo "no benchmark results"
bash experiments/pack_triton_cache.sh "$TRITON_CACHE_DIR" "$out/triton_cache.tgz"
