#!/usr/bin/env bash
# One device call: everything GPU-only that checks correctness of the fused model pieces, the decoding kernels and
# the engine — the fused kernels' tests compiled on CUDA (short conv and its decoding step, norms, SwiGLU, the
# log-decay gate, cross-entropy rows, the fused recurrent kernel updating states in place), the engine's tests
# (CUDA graphs against plain steps, the Triton decoding kernels), the GPU-marked tests (inductor bf16 model vs
# eager, packed documents), FLA checkpoints against FLA's model, the newest cells and hybrids, and with
# VERIFY_CHUNK_CHECK="ARGS" the fp64 chunk check (experiments/check_triton_chunk.py ARGS) beside them. On a cold
# machine Triton compiles every kernel first, so the groups run as parallel processes (CPU-bound compiles) with
# verbose logs: a group cut by its timeout still shows which tests passed. Carry .whl (and .triton_cache.tgz when
# there is one).
# VERIFY_GROUPS="new_kernels inference ..." runs only the groups named (default: all below).
# Writes $OUT/<group>.log, $OUT/check.log and $OUT/triton_cache.tgz.
set -uo pipefail
source experiments/device_env.sh  # wheels, PYTHONPATH, Triton cache, $out
seconds="${VERIFY_SECONDS:-480}"
if [ -n "${VERIFY_CHUNK_CHECK:-}" ]; then  # e.g. VERIFY_CHUNK_CHECK="--cells gammanet --dtypes bf16"
  # shellcheck disable=SC2086
  timeout -k 10 "$seconds" python3 experiments/check_triton_chunk.py $VERIFY_CHUNK_CHECK \
    --max-seconds $((seconds - 90)) > "$out/check.log" 2>&1 &
fi
pytest=(python3 -m pytest -o addopts= -v -rfE --tb=short -p no:cacheprovider -p no:warnings)
groups="${VERIFY_GROUPS:-short_conv fused fused_recurrent linear inference compile packed fla_checkpoints new_kernels new_models}"
group() {  # group NAME PYTEST-ARGS...: one pytest process in the background, its log in $OUT/NAME.log
  local name="$1"
  shift
  [[ " $groups " == *" $name "* ]] || return 0
  timeout -k 10 "$seconds" "${pytest[@]}" "$@" > "$out/$name.log" 2>&1 &
}
group short_conv tests/kernels/test_short_conv.py
group fused tests/kernels/test_fused.py tests/models/test_loss.py::test_triton_rows_kernel_matches_cross_entropy \
  tests/models/test_loss.py::test_triton_rows_bf16_under_autocast_matches_fp64
group chunk tests/kernels/test_triton_chunk.py  # the chunk kernels' CPU tests, compiled (not in the default groups)
group fused_recurrent tests/kernels/test_triton_fused_recurrent.py
group linear tests/kernels/test_linear.py tests/kernels/test_greedy.py tests/kernels/test_cuda.py -k "linear or matrix_vector or model_decode or greedy"
group inference tests/models/test_inference.py
group compile -m gpu tests/models/test_compile.py
group compile_new -m gpu tests/models/test_compile.py -k "gdn2 or mamba2"  # in "compile" too: for a short call
group packed -m gpu tests/models/test_packed_documents.py
group fla_checkpoints -rs tests/models/test_fla_checkpoints.py  # against FLA's model (its wheels carried)
# the newest cells and structures through the Triton kernels against fp64 (GDN-2's gated erase, Mamba-2), and the
# models of the new cells and hybrids (the engine with CUDA graphs); two processes, for the compiles
group new_kernels tests/kernels/test_cuda.py tests/kernels/test_triton_chunk.py -k "gdn2 or mamba2 or erase_gate"
group new_models tests/recurrences/test_new_cells.py tests/models/test_engine_hybrid.py tests/models/test_hybrid.py \
  tests/kernels/test_cuda.py -k "gdn2 or mamba2 or hybrid or cuda_graph or model_decode"
wait
for name in $groups; do
  echo "== $name: $(tail -1 "$out/$name.log")"
  grep -E "^(FAILED|ERROR)" "$out/$name.log"
done
if [ -f "$out/check.log" ]; then grep -E "PASS|FAIL|NOT RUN|passed" "$out/check.log"; fi
bash experiments/pack_triton_cache.sh "$TRITON_CACHE_DIR" "$out/triton_cache.tgz"
