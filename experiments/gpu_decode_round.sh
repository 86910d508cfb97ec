#!/usr/bin/env bash
# One device call for decoding work: the GPU test groups of the decoding kernels, where a step's time goes for
# BASE_TREE (when given) and this tree (gpu_profile_decode.sh), and the fused recurrent kernel's launch shapes at the
# 340M model's decoding step. Writes $OUT/<group>.log, $OUT/profile_decode.txt, $OUT/tune_fused_recurrent.txt.
set -uo pipefail
source experiments/device_env.sh
VERIFY_GROUPS="${VERIFY_GROUPS:-short_conv fused linear inference}" bash experiments/gpu_verify.sh 2>&1 | grep -E "^==|FAILED|ERROR"
bash experiments/gpu_profile_decode.sh > /dev/null 2>&1
grep -E "^==|graph replay" "$out/profile_decode.txt"
if [ -n "${TUNE_FUSED_RECURRENT:-}" ]; then
  timeout -k 10 120 python3 benchmarks/tune_fused_recurrent.py --heads 6 --value-dim 256 --batches 1 256 --steps 1 \
    --in-place > "$out/tune_fused_recurrent.txt" 2>&1
  cat "$out/tune_fused_recurrent.txt"
fi
