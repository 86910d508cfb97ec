#!/usr/bin/env bash
# One device call for the short convolution: its tests compiled on the GPU (tests/kernels/test_short_conv.py, against
# the fp64 loop), then benchmarks/test_short_conv_gpu.py (linrnn vs FLA 0.6.0's causal_conv1d) and its table; with a
# second source tree as the argument, the same for that tree first, to compare two versions of the kernels in one
# call (make it here with `mkdir .old && git archive BRANCH_OR_COMMIT linrnn tests benchmarks | tar x -C .old`, and
# carry it). Carry .whl and .triton_cache.tgz.
# Usage: bash experiments/gpu_short_conv.sh [OTHER_TREE]
# Writes $OUT/<tree>_tests.log, $OUT/<tree>_short_conv.json, $OUT/<tree>_short_conv.md and $OUT/triton_cache.tgz.
set -uo pipefail
source experiments/device_env.sh  # wheels, PYTHONPATH, Triton cache, $out
run_tree() {  # run_tree NAME DIR
  local name="$1" dir
  dir="$(cd "$2" && pwd)"
  echo "== $name ($dir)"
  (cd "$dir" && PYTHONPATH="$SITE:$dir" python3 -m pytest -q -o addopts= -p no:cacheprovider \
    tests/kernels/test_short_conv.py > "$out/${name}_tests.log" 2>&1)
  tail -1 "$out/${name}_tests.log"
  (cd "$dir" && PYTHONPATH="$SITE:$dir" python3 -m pytest -q -p no:cacheprovider benchmarks/test_short_conv_gpu.py \
    --benchmark-only --benchmark-json="$out/${name}_short_conv.json" > "/tmp/${name}_bench.log" 2>&1) ||
    tail -20 "/tmp/${name}_bench.log"
  python3 benchmarks/report.py "$out/${name}_short_conv.json" | tee "$out/${name}_short_conv.md"
}
if [ $# -gt 0 ]; then run_tree other "$1"; fi
run_tree this .
bash experiments/pack_triton_cache.sh "$TRITON_CACHE_DIR" "$out/triton_cache.tgz"
