#!/usr/bin/env bash
# One device call: the whole-model training step (benchmarks/test_model_gpu.py) once per value of one environment
# variable of the benchmark, in this tree, so settings are read against each other in the same run.
# Usage (device tool; carry .whl and .triton_cache.tgz):
#   MODEL_BENCH_MODELS=linrnn_gdn_compiled MODEL_BENCH_SHAPES=4x4096 \
#   bash experiments/gpu_model_settings.sh MODEL_BENCH_KEEP_INTRA decoupled always
# Writes $OUT/settings_<value>.json and prints each run's table; with MODEL_BENCH_PROFILE=1, each run's profiler
# tables and traces in $OUT/profile_<value>/; $OUT/triton_cache.tgz for the next call.
set -uo pipefail
variable="$1"
shift
source experiments/device_env.sh
for value in "$@"; do
  profile=()
  if [ "${MODEL_BENCH_PROFILE:-}" = 1 ]; then
    mkdir -p "$out/profile_$value"
    profile=("MODEL_BENCH_PROFILE_DIR=$out/profile_$value")
  fi
  env "$variable=$value" "${profile[@]}" timeout -k 20 280 python3 -m pytest -q -p no:cacheprovider benchmarks/test_model_gpu.py \
    --benchmark-only --benchmark-json="$out/settings_$value.json" > "/tmp/settings_$value.log" 2>&1 \
    || tail -20 "/tmp/settings_$value.log"
  echo "$variable=$value"
  python3 benchmarks/report.py "$out/settings_$value.json" | grep "^| [0-9]" || echo "$value: no results"
done
bash experiments/pack_triton_cache.sh "$TRITON_CACHE_DIR" "$out/triton_cache.tgz"
