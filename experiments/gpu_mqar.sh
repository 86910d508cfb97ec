#!/usr/bin/env bash
# Issue 37's MQAR at the GPU setting (docs/evaluation.md, "GPU"), on a host of 4 GPUs: FLA's GDN model on
# $FLA_DEVICES (default cuda:0), linrnn's six mixers on $LINRNN_DEVICES (default cuda:1,cuda:2,cuda:3), $FLA_JOBS and
# $LINRNN_JOBS processes per GPU (2, 3). Both resume from the rows already in docs/results/mqar/gpu_{fla,linrnn}.json
# (copied to $OUT first; rows added as runs end), and stop after MQAR_BUDGET seconds (default 540), which loses only
# the runs in flight. FLA_LRS and FLA_WIDTHS narrow FLA's grid (width 64, head dim K = 24, failed with an illegal
# memory access in FLA's backward on an H200 with Triton 3.6). COORD_TABLE=1 also runs
# experiments/coord_table.py on the host's CPUs meanwhile ($OUT/coord_table.*).
# Usage (nvidia-h100-x4; carry .whl and .triton_cache.tgz): bash experiments/gpu_mqar.sh
set -uo pipefail
source experiments/device_env.sh
task=(--seeds 0,1,2 --seq-len 256 --pairs 16 --vocab 8192 --layers 2 --heads 2 --steps 4000 --batch-size 64
      --test-examples 1000)
for part in fla linrnn; do
  [ -f "docs/results/mqar/gpu_$part.json" ] && cp "docs/results/mqar/gpu_$part.json" "$out/mqar_$part.json"
done
budget="${MQAR_BUDGET:-540}"
if [ "${COORD_TABLE:-0}" = 1 ]; then
  OMP_NUM_THREADS=1 timeout "$budget" python3 experiments/coord_table.py --jobs 21 --json "$out/coord_table.json" \
    > "$out/coord_table.txt" 2>&1 &
fi
timeout "$budget" python3 -m linrnn eval mqar --cells fla-gdn --widths "${FLA_WIDTHS:-128,256}" --lrs "${FLA_LRS:-0.001,0.003}" \
  "${task[@]}" --device "${FLA_DEVICES:-cuda:0}" --jobs "${FLA_JOBS:-2}" --out "$out/mqar_fla.json" \
  > "$out/mqar_fla.txt" 2>&1 &
timeout "$budget" python3 -m linrnn eval mqar --cells gla,deltanet,gdn,kda,gammanet,attention --widths "${LINRNN_WIDTHS:-64,128,256}" \
  --lrs 0.001,0.003 "${task[@]}" --device "${LINRNN_DEVICES:-cuda:1,cuda:2,cuda:3}" --jobs "${LINRNN_JOBS:-3}" \
  --out "$out/mqar_linrnn.json" > "$out/mqar_linrnn.txt" 2>&1 &
wait
pkill -f multiprocessing.spawn  # workers of a parent stopped by timeout
bash experiments/pack_triton_cache.sh "$TRITON_CACHE_DIR" "$out/triton_cache.tgz"
tail -n 4 "$out"/mqar_*.txt $([ -f "$out/coord_table.txt" ] && echo "$out/coord_table.txt")
