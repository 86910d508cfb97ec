#!/usr/bin/env bash
# One device call: the whole-model training step (benchmarks/test_model_gpu.py) from two source trees in turn on one
# machine, so a change's effect on the step is read against a baseline of the same run.
# Usage (device tool; carry .whl and .triton_cache.tgz; the old tree made here with
#   mkdir .old && git archive OLD_COMMIT linrnn benchmarks | tar x -C .old):
#   MODEL_BENCH_MODELS=linrnn_gdn_compiled MODEL_BENCH_SHAPES=4x4096 bash experiments/gpu_model_trees.sh .old [RUNS]
# Writes $OUT/model_before_N.json, $OUT/model_after_N.json and prints each run's table. With SAVE_INDUCTOR_CODE=1
# each run's inductor output code (the compiled graphs' Python, which names its fused kernels and the ops in each)
# goes to $OUT/code_<run>.tgz.
set -uo pipefail
old="$(cd "$1" && pwd)"
runs="${2:-1}"
source experiments/device_env.sh  # wheels, PYTHONPATH (this tree first: replaced per run below), Triton cache, $out
new="$PWD"
bench() {  # tree, json name
  (cd "$1" && TORCHINDUCTOR_CACHE_DIR="/tmp/inductor_$2" PYTHONPATH="$1:$SITE" timeout -k 20 280 python3 -m pytest -q -p no:cacheprovider \
    benchmarks/test_model_gpu.py --benchmark-only --benchmark-json="$out/$2.json" > "/tmp/$2.log" 2>&1) \
    || tail -20 "/tmp/$2.log"
  python3 benchmarks/report.py "$out/$2.json" | grep "^| [0-9]" || echo "$2: no results"
  if [ -n "${SAVE_INDUCTOR_CODE:-}" ]; then
    grep -rl --include="*.py" "async_compile.wait" "/tmp/inductor_$2" | tar czf "$out/code_$2.tgz" -T - 2>/dev/null
  fi
}
for i in $(seq "$runs"); do
  bench "$old" "model_before_$i"
  bench "$new" "model_after_$i"
done
