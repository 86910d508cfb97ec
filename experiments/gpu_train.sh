#!/usr/bin/env bash
# Issue 6 on the GPU machines: a 340M Gated DeltaNet trained through torchtitan (python -m linrnn.train), bf16,
# sequence length 4096, on the embedded corpus. One device call per mode:
#   bash experiments/gpu_train.sh single   # nvidia-h100-x1: 200 steps with linrnn's Triton kernels (loss, tokens/s,
#                                      # MFU), then 40 steps with FLA's chunk_gated_delta_rule swapped in (speed only)
#   bash experiments/gpu_train.sh compile  # nvidia-h100-x1: the same 200 steps as "single" with --compile.enable (each
#                                      # block through torch.compile with linrnn's custom ops); compare with "single"
#   bash experiments/gpu_train.sh curve    # nvidia-h100-x1: issue 24's check, 200 steps eager then 200 steps with
#                                      # --compile.enable, no validation: tokens/s, MFU (6·N) and the two loss curves;
#                                      # CURVE_SEEDS="1 2" adds the same pair from other initialisations (--debug.seed):
#                                      # the spread that compiled − eager is judged against
#   bash experiments/gpu_train.sh mfu      # nvidia-h100-x1: only the compiled half of "curve" (200 steps, no validation), for
#                                      # tokens/s and MFU on a GPU of its own
#   bash experiments/gpu_train.sh profile  # nvidia-h100-x1: 40 compiled steps with torchtitan's profiler on step 30; where the
#                                      # step's time goes (experiments/trace_summary.py) in $OUT/trace_summary.txt
#   bash experiments/gpu_train.sh cp       # nvidia-h200-x2 (needs_h200): context parallelism, compiled: one GPU at
#                                      # 1 × 65536 tokens, one GPU at 1 × 131072 (expected not to fit), then two GPUs
#                                      # at 1 × 131072 with --parallelism.context_parallel_degree 2; tokens/s per GPU (CP_SKIP_ONE_131072=1: not
#                                      # the second)
#   bash experiments/gpu_train.sh fsdp     # nvidia-h200-x2: the packed-document GPU test, then the same global batch
#                                      # (4 × 4096) on 1 GPU, on 1 GPU as 2 micro-batches, and on 2 GPUs with FSDP
# TRAIN_CONFIG names the config (default gdn_340m_sp; e.g. gdn-hybrid_340m_sp, the 3:1 hybrid, with mode mfu).
# TRAIN_EXTRA="--flag value ..." adds torchtitan flags to the mfu and profile runs (e.g.
# "--parallelism.fsdp_reshard_after_forward never").
# Carry .whl (fla-core, pydantic), .whl-train (torchtitan and its pure-Python dependencies, tokenizers), .data
# (LINRNN_DATA: the prepared corpus, `LINRNN_DATA=.data linrnn data prepare`) and .triton_cache.tgz when there.
# Writes $OUT/<run>/metrics.jsonl, $OUT/<run>.log, $OUT/report.md and $OUT/triton_cache.tgz.
set -uo pipefail
mode="${1:-single}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "${SITE:=/tmp/site}" \
  .whl/*.whl .whl-train/*.whl || exit 1
export PYTHONPATH="$SITE:$PWD" LINRNN_DATA="$PWD/.data" FLA_DISABLE_BACKEND_DISPATCH=1 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export TRITON_CACHE_DIR="$PWD/.triton_cache" TRITON_CACHE_AUTOTUNING=1 TRITON_STORE_BINARY_ONLY=1
out="${OUT:-/tmp}"
mkdir -p "$TRITON_CACHE_DIR"
if [ -f .triton_cache.tgz ]; then tar xzf .triton_cache.tgz -C "$TRITON_CACHE_DIR"; fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import torch, triton, torchtitan; print('torch', torch.__version__, 'triton', triton.__version__, 'torchtitan 0.3.0')"
config="${TRAIN_CONFIG:-gdn_340m_sp}"
common=(--config "$config" --metrics.log_freq 10 --checkpoint.no-enable)

run() {  # run NAME SECONDS NPROC ENTRY ARGS...: one torchrun, its log in $OUT/NAME.log
  local name="$1" seconds="$2" nproc="$3" entry="$4"
  shift 4
  echo "== $name: $nproc process(es), $*"
  local start=$SECONDS
  timeout -k 20 "$seconds" torchrun --nproc_per_node="$nproc" --master_port=$((29500 + RANDOM % 1000)) $entry \
    "${common[@]}" --dump_folder "$out/$name" "$@" > "$out/$name.log" 2>&1
  echo "   exit $? after $((SECONDS - start)) s"
  grep -E "step: +(1|10|50|100|150|200) |validate step" "$out/$name.log" | sed 's/\x1b\[[0-9;]*m//g' | cut -c 45- | tail -8
  grep -E "Error|error:" "$out/$name.log" | grep -v -E "lspci|UserWarning" | tail -3
}

if [ "$mode" = single ]; then
  run linrnn 330 1 "-m linrnn.train" --training.steps 200 --validator.freq 100
  run fla 200 1 experiments/train_fla.py --training.steps 40 --validator.no-enable
  python3 experiments/train_report.py linrnn="$out/linrnn" fla="$out/fla" | tee "$out/report.md"
elif [ "$mode" = curve ]; then
  curve=(--training.steps 200 --validator.no-enable)
  run eager "${CURVE_EAGER_S:-200}" 1 "-m linrnn.train" "${curve[@]}"
  run compiled "${CURVE_COMPILED_S:-330}" 1 "-m linrnn.train" "${curve[@]}" --compile.enable
  runs=(eager="$out/eager" compiled="$out/compiled")
  for seed in ${CURVE_SEEDS:-}; do  # the spread to judge compiled − eager by: the same pair from another init
    run "eager-seed$seed" "${CURVE_EAGER_S:-200}" 1 "-m linrnn.train" "${curve[@]}" --debug.seed "$seed"
    run "compiled-seed$seed" "${CURVE_COMPILED_S:-330}" 1 "-m linrnn.train" "${curve[@]}" --debug.seed "$seed" \
      --compile.enable
    runs+=("eager-seed$seed=$out/eager-seed$seed" "compiled-seed$seed=$out/compiled-seed$seed")
  done
  python3 experiments/train_report.py "${runs[@]}" --config "$config" | tee "$out/report.md"
elif [ "$mode" = mfu ]; then
  # shellcheck disable=SC2086
  run compiled "${CURVE_COMPILED_S:-330}" 1 "-m linrnn.train" --training.steps 200 --validator.no-enable --compile.enable \
    ${TRAIN_EXTRA:-}
  python3 experiments/train_report.py compiled="$out/compiled" --config "$config" | tee "$out/report.md"
elif [ "$mode" = profile ]; then
  # shellcheck disable=SC2086
  run profiled "${CURVE_COMPILED_S:-240}" 1 "-m linrnn.train" --training.steps 40 --validator.no-enable --compile.enable \
    --profiler.enable_profiling --profiler.profile_freq 30 ${TRAIN_EXTRA:-}
  trace=$(find "$out/profiled" -name 'rank0_trace.json*' | sort | tail -1)
  python3 experiments/trace_summary.py "$trace" --top 40 | tee "$out/trace_summary.txt"
  rm -rf "$out/profiled/profiling"
elif [ "$mode" = cp ]; then
  cp=(--training.steps "${CP_STEPS:-20}" --training.local_batch_size 1 --validator.no-enable --compile.enable
      --metrics.log_freq 1)
  CUDA_VISIBLE_DEVICES=0 run one-65536 240 1 "-m linrnn.train" "${cp[@]}" --training.seq_len 65536
  if [ -z "${CP_SKIP_ONE_131072:-}" ]; then
    CUDA_VISIBLE_DEVICES=0 run one-131072 150 1 "-m linrnn.train" "${cp[@]}" --training.seq_len 131072 \
      --training.steps 2
    grep -m1 -o "OutOfMemoryError: CUDA out of memory. Tried to allocate [0-9.]* [GM]iB" "$out/one-131072.log"
  fi
  run cp2-131072 300 2 "-m linrnn.train" "${cp[@]}" --training.seq_len 131072 --parallelism.context_parallel_degree 2
  grep -h "memory" "$out/one-65536.log" "$out/cp2-131072.log" | sed 's/\x1b\[[0-9;]*m//g' | tail -4 | cut -c 45-
  python3 experiments/train_report.py one-65536="$out/one-65536" cp2-131072="$out/cp2-131072" --skip 5 \
    --config "$config" | tee "$out/report.md"
elif [ "$mode" = compile ]; then
  run compiled 540 1 "-m linrnn.train" --training.steps 200 --validator.freq 100 --compile.enable
  python3 experiments/train_report.py compiled="$out/compiled" | tee "$out/report.md"
else
  timeout -k 10 150 python3 -m pytest -q -p no:cacheprovider tests/models/test_packed_documents.py -m gpu 2>&1 | tail -5
  fsdp=(--training.steps 60 --training.global_batch_size 4 --validator.no-enable)
  run one 150 1 "-m linrnn.train" "${fsdp[@]}" --training.local_batch_size 4
  run accum 150 1 "-m linrnn.train" "${fsdp[@]}" --training.local_batch_size 2
  run two 150 2 "-m linrnn.train" "${fsdp[@]}" --training.local_batch_size 2
  python3 experiments/train_report.py one="$out/one" accum="$out/accum" two="$out/two" | tee "$out/report.md"
fi
bash experiments/pack_triton_cache.sh "$TRITON_CACHE_DIR" "$out/triton_cache.tgz"
