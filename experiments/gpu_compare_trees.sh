#!/usr/bin/env bash
# One device call: linrnn's chunkwise ops (benchmarks/test_chunk_gpu.py, linrnn rows only) timed from two source
# trees alternately, RUNS times each, then benchmarks/compare_runs.py's table.
# Usage (device tool; carry .whl and the old tree, e.g. made here with
#   mkdir .old && git archive OLD_COMMIT linrnn tests benchmarks | tar x -C .old):
#   bash experiments/gpu_compare_trees.sh .old [RUNS] [more pytest arguments, e.g. -k 8x4096]
# Writes $OUT/before_N.json, $OUT/after_N.json and $OUT/compare.md (logs in /tmp).
set -uo pipefail
old="$(cd "$1" && pwd)"
runs="${2:-2}"
shift $(($# < 2 ? $# : 2))
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "${SITE:=/tmp/site}" .whl/*.whl || exit 1
export PYTHONPATH="$SITE" PYTHONUNBUFFERED=1
out="${OUT:-/tmp}"
new="$PWD"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
bench() {  # tree, json name, extra pytest arguments
  local tree="$1" name="$2"
  shift 2
  (cd "$tree" && PYTHONPATH="$tree:$PYTHONPATH" python3 -m pytest -q -p no:cacheprovider benchmarks/test_chunk_gpu.py \
    -k linrnn --benchmark-only --benchmark-json="$out/$name.json" "$@" > "/tmp/$name.log" 2>&1) || tail -20 "/tmp/$name.log"
}
for i in $(seq "$runs"); do
  bench "$old" "before_$i" "$@"
  bench "$new" "after_$i" "$@"
  echo "round $i done at ${SECONDS}s"
done
python3 benchmarks/compare_runs.py --before "$out"/before_*.json --after "$out"/after_*.json | tee "$out/compare.md"
