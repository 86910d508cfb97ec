#!/usr/bin/env bash
# One device call: everything GPU-only that checks correctness of the fused model pieces and the engine —
# the fused kernels' tests compiled on CUDA (short conv, norms, SwiGLU, cross-entropy rows), the GPU-marked tests
# (inductor bf16 model vs eager, CUDA graphs vs plain decoding, packed documents), and the fp64 chunk check's
# GammaNet fp32 varlen and extreme-gates cases (the ones issue 22's last check left) in parallel.
# Carry .whl and .triton_cache.tgz. Writes $OUT/tests.log, $OUT/tests_gpu.log and $OUT/check.log.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
out="${OUT:-/tmp}"
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR="$PWD/.triton_cache" TRITON_CACHE_AUTOTUNING=1 TRITON_STORE_BINARY_ONLY=1
mkdir -p "$TRITON_CACHE_DIR"
if [ -f .triton_cache.tgz ]; then tar xzf .triton_cache.tgz -C "$TRITON_CACHE_DIR"; fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cases=(varlen "varlen, no initial state" "extreme gates")
check_s="${VERIFY_CHECK_S:-300}"
timeout -k 10 "$check_s" python3 scripts/check_triton_chunk.py --only small --cells gammanet --dtypes fp32 \
  --cases "${cases[@]}" --max-seconds $((check_s - 90)) > "$out/check.log" 2>&1 &
pytest=(python3 -m pytest -q -rfE --tb=short -p no:cacheprovider -p no:warnings)
timeout -k 10 200 "${pytest[@]}" tests/kernels/test_short_conv.py tests/kernels/test_fused.py \
  tests/models/test_loss.py::test_triton_rows_kernel_matches_cross_entropy > "$out/tests.log" 2>&1
tail -3 "$out/tests.log"
timeout -k 10 420 "${pytest[@]}" -m gpu tests/models/test_compile.py tests/models/test_inference.py \
  tests/models/test_packed_documents.py > "$out/tests_gpu.log" 2>&1
tail -15 "$out/tests_gpu.log"
wait
grep -E "PASS|FAIL|NOT RUN|passed" "$out/check.log"
