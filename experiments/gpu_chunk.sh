#!/usr/bin/env bash
# One device call for the chunkwise kernels: the correctness check against the fp64 reference
# (experiments/check_triton_chunk.py), then the training benchmark against FLA 0.6.0 and SDPA
# (benchmarks/test_chunk_gpu.py) and its RESULTS.md tables.
# Usage (device tool; carry .whl, and .triton_cache.tgz when you have one):
#   bash experiments/gpu_chunk.sh [all|check|bench] [more pytest arguments for the benchmark, e.g. -k 8x4096]
# Writes $OUT/check.log, $OUT/chunk.json, $OUT/chunk.log and $OUT/triton_cache.tgz.
# The Triton cache (compiled kernels and autotune results; FLA 0.6.0 caches its autotuning on disk by default)
# lives in .triton_cache/ and goes back as $OUT/triton_cache.tgz: copy that file to .triton_cache.tgz in the
# repository and carry it next time to skip most of FLA's cold-start autotuning (~8 min for four ops per shape).
# Time: everything ends within CHUNK_BUDGET_S (default 540 s); the check gets at most CHUNK_CHECK_S (default 420 s
# for "check", 240 s for "all"). On a cold machine run "check" and "bench" as two calls.
# CHUNK_CHECK_ARGS adds arguments to the check (e.g. "--cells kda gammanet"); CHUNK_CHECK_PER_CELL="gla kda" runs one
# check process per listed cell in parallel (their logs: $OUT/check_<cell>.log); the benchmark reads CHUNK_BENCH_*.
set -uo pipefail
step="${1:-all}"
[ $# -gt 0 ] && shift
deadline=$((SECONDS + ${CHUNK_BUDGET_S:-540}))
source experiments/device_env.sh  # wheels, PYTHONPATH, Triton cache, $out
tuned=$(find "$TRITON_CACHE_DIR" -name '*.autotune.json' | wc -l)
echo "triton cache: $tuned autotune results, $(du -sh "$TRITON_CACHE_DIR" | cut -f1)"
python3 -c "import torch, triton, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'fla', fla.__version__)"

status=0
if [ "$step" != bench ]; then
  check_s="${CHUNK_CHECK_S:-$([ "$step" = check ] && echo 420 || echo 240)}"
  limit=$((deadline - SECONDS - 60))
  limit=$((limit < check_s ? limit : check_s))
  # no new case in the last 90 s (a large case compiles and runs its fp64 reference in about that)
  if [ -n "${CHUNK_CHECK_PER_CELL:-}" ]; then  # one process per cell, in parallel (the large cases run one by one)
    pids=()
    for cell in $CHUNK_CHECK_PER_CELL; do
      timeout -k 20 "$limit" python3 experiments/check_triton_chunk.py --max-seconds $((limit - 90)) --cells "$cell" \
        ${CHUNK_CHECK_ARGS:-} > "$out/check_$cell.log" 2>&1 &
      pids+=($!)
    done
    status=0
    for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
    cat "$out"/check_*.log | tee "$out/check.log"
  else
    timeout -k 20 "$limit" python3 experiments/check_triton_chunk.py --max-seconds $((limit - 90)) ${CHUNK_CHECK_ARGS:-} 2>&1 \
      | tee "$out/check.log"
    status=${PIPESTATUS[0]}
  fi
fi
if [ "$step" != check ]; then
  # tests that would start in the last 150 s skip (FLA autotunes one op for a minute or more when cold); the hard
  # limit leaves 30 s to pack the cache, though pytest-benchmark writes no JSON when it cuts a benchmark short
  export CHUNK_BENCH_DEADLINE=$(($(date +%s) + deadline - SECONDS - 150))
  timeout -k 20 $((deadline - SECONDS - 30)) python3 -m pytest -q -p no:cacheprovider benchmarks/test_chunk_gpu.py \
    --benchmark-only --benchmark-json="$out/chunk.json" --benchmark-columns=median,rounds "$@" > "$out/chunk.log" 2>&1 \
    || tail -30 "$out/chunk.log"
  python3 benchmarks/report.py "$out/chunk.json" || echo "no benchmark results"
fi

bash experiments/pack_triton_cache.sh "$TRITON_CACHE_DIR" "$out/triton_cache.tgz"
exit "$status"
