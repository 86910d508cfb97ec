#!/usr/bin/env bash
# One device call: the whole-model training-step benchmark (benchmarks/test_model_gpu.py) and its RESULTS.md table.
# Carry .whl (pydantic and its dependencies, einops, fla-core 0.6.0 and flash-linear-attention 0.6.0; transformers
# is on the machine) and .triton_cache.tgz when there is one.
# Usage: bash experiments/gpu_model.sh [more pytest arguments, e.g. -k 4x4096]
# Env: MODEL_BENCH_MODELS, MODEL_BENCH_SHAPES, MODEL_BENCH_ROUNDS (the test module's docstring); MODEL_BENCH_SECONDS
# (default 540) bounds the run, and no test starts in its last MODEL_BENCH_MARGIN seconds (default 150); writes $OUT/model.json,
# $OUT/model.log, $OUT/profile_*.txt (linrnn models) and $OUT/triton_cache.tgz.
set -uo pipefail
source experiments/device_env.sh  # wheels, PYTHONPATH, Triton cache, $out
export MODEL_BENCH_PROFILE_DIR="$out"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python3 -c "import fla, transformers; print('fla', fla.__version__, 'transformers', transformers.__version__)"
seconds="${MODEL_BENCH_SECONDS:-540}"
export MODEL_BENCH_DEADLINE=$(($(date +%s) + seconds - ${MODEL_BENCH_MARGIN:-150}))  # no test starts in the last 150 s
timeout -k 20 "$seconds" python3 -m pytest -q -p no:cacheprovider benchmarks/test_model_gpu.py \
  --benchmark-only --benchmark-json="$out/model.json" --benchmark-columns=median,rounds "$@" > "$out/model.log" 2>&1 \
  || tail -40 "$out/model.log"
python3 benchmarks/report.py "$out/model.json" || echo "no benchmark results"
bash experiments/pack_triton_cache.sh "$TRITON_CACHE_DIR" "$out/triton_cache.tgz"
