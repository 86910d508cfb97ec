#!/usr/bin/env bash
# Issue 7 on the GPU machine: learning-rate transfer sweeps (linrnn sweep), resumable across device calls.
#   bash experiments/gpu_sweep.sh probe SECONDS [sweep_probe.py flags]   # tokens/s, one process and several
#   bash experiments/gpu_sweep.sh profile [SECONDS]     # torch.profiler of short runs at widths 128 and 1024
#   bash experiments/gpu_sweep.sh coord SECONDS [sgd_coord_probe.py flags]   # the coordinate probe (--json under $OUT)
#   bash experiments/gpu_sweep.sh TABLE SECONDS [linrnn sweep flags...]
#       trains the grid's missing runs into TABLE (a tracked file: it travels with the working tree) for at most
#       SECONDS, then copies TABLE to $OUT/sweep/ (copy it back into the repository; only 8 files come back, so write
#       the report and plots locally: linrnn sweep --report-only --table TABLE [the same grid flags]).
#       One process at a time: two or four sweeps sharing the H100 trained 0.7x as many runs per second as one.
# MPS=1 runs everything under the CUDA MPS daemon (several processes' kernels run concurrently), stopped at the end.
# GPU_TESTS=SECONDS first runs the GPU tests of GPU_TEST_FILES (default tests/models/test_packed_documents.py) for at
# most SECONDS.
# Carry .whl, .whl-train (torchtitan, tokenizers, ...), .data (the prepared corpus) and .triton_cache.tgz.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "${SITE:=/tmp/site}" \
  .whl/*.whl .whl-train/*.whl || exit 1
export PYTHONPATH="$SITE:$PWD" LINRNN_DATA="$PWD/.data" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR="$PWD/.triton_cache" TRITON_CACHE_AUTOTUNING=1 TRITON_STORE_BINARY_ONLY=1
out="${OUT:-/tmp}"
mkdir -p "$TRITON_CACHE_DIR" "$out/sweep"
if [ -f .triton_cache.tgz ]; then tar xzf .triton_cache.tgz -C "$TRITON_CACHE_DIR"; fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ -n "${MPS:-}" ]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d && echo "MPS daemon started" || echo "MPS daemon did not start"
  trap 'echo quit | nvidia-cuda-mps-control' EXIT
fi

if [ -n "${GPU_TESTS:-}" ]; then  # the GPU tests of packed documents and autocast first (their autotuning is cached)
  timeout -k 10 "$GPU_TESTS" python3 -m pytest -q -p no:cacheprovider ${GPU_TEST_FILES:-tests/models/test_packed_documents.py} -m gpu \
    > "$out/gpu_tests.log" 2>&1
  tail -3 "$out/gpu_tests.log"
fi
if [ "$1" = profile ]; then
  timeout -k 10 "${2:-300}" python3 experiments/sweep_profile.py > "$out/profile.log" 2>&1
  grep -v -i warn "$out/profile.log" | tail -150
elif [ "$1" = coord ]; then
  seconds="$2"
  shift 2
  timeout -k 10 "$seconds" python3 experiments/sgd_coord_probe.py --device cuda "$@" > "$out/coord.log" 2>&1
  grep -v -i warn "$out/coord.log" | tail -150
elif [ "$1" = probe ]; then
  seconds="$2"
  shift 2
  timeout -k 10 "$seconds" python3 experiments/sweep_probe.py "$@" > "$out/probe.log" 2>&1
  grep -v -i warn "$out/probe.log" | tail -30
else
  table="$1" seconds="$2"
  shift 2
  # no run starts after SECONDS - 90 s, so the run in flight (up to a minute when it autotunes) ends in time
  # SWEEP="python3 experiments/sweep_variants.py" runs a script that registers parametrization variants first
  timeout -k 10 "$seconds" ${SWEEP:-python3 -m linrnn sweep} --table "$table" --time-limit $((seconds - 90)) "$@" \
    > "$out/sweep.log" 2>&1
  grep -v -i warn "$out/sweep.log" | tail -60
  cp "$table" "$out/sweep/" 2>/dev/null
fi
bash experiments/pack_triton_cache.sh "$TRITON_CACHE_DIR" "$out/triton_cache.tgz"
