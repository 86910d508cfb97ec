#!/usr/bin/env bash
# One device call: everything GPU-only that checks correctness of the fused model pieces, the decoding kernels and
# the engine — the fused kernels' tests compiled on CUDA (short conv and its decoding step, norms, SwiGLU, the
# log-decay gate, cross-entropy rows, the fused recurrent kernel updating states in place), the engine's tests
# (CUDA graphs against plain steps, the Triton decoding kernels), the GPU-marked tests (inductor bf16 model vs
# eager, packed documents), and, in parallel, the fp64 chunk check of GammaNet in bf16 (the op folds q and k
# itself and runs bf16 kernels with fp32 gradients of the folded inputs).
# Carry .whl and .triton_cache.tgz. Writes $OUT/tests.log, $OUT/tests_gpu.log and $OUT/check.log.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
out="${OUT:-/tmp}"
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR="$PWD/.triton_cache" TRITON_CACHE_AUTOTUNING=1 TRITON_STORE_BINARY_ONLY=1
mkdir -p "$TRITON_CACHE_DIR"
if [ -f .triton_cache.tgz ]; then tar xzf .triton_cache.tgz -C "$TRITON_CACHE_DIR"; fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
check_s="${VERIFY_CHECK_S:-420}"
timeout -k 10 "$check_s" python3 scripts/check_triton_chunk.py --cells gammanet --dtypes bf16 \
  --max-seconds $((check_s - 90)) > "$out/check.log" 2>&1 &
pytest=(python3 -m pytest -q -rfE --tb=short -p no:cacheprovider -p no:warnings)
timeout -k 10 150 "${pytest[@]}" tests/kernels/test_short_conv.py tests/kernels/test_fused.py \
  tests/kernels/test_triton_fused_recurrent.py tests/models/test_loss.py::test_triton_rows_kernel_matches_cross_entropy \
  tests/models/test_inference.py > "$out/tests.log" 2>&1
tail -3 "$out/tests.log"
timeout -k 10 390 "${pytest[@]}" -m gpu tests/models/test_compile.py tests/models/test_packed_documents.py \
  > "$out/tests_gpu.log" 2>&1
tail -15 "$out/tests_gpu.log"
wait
grep -E "PASS|FAIL|NOT RUN|passed" "$out/check.log"
