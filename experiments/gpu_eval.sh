#!/usr/bin/env bash
# Issue 37's GPU runs on one GPU, at once: the MQAR sweep at the GPU setting of docs/evaluation.md (every mixer and
# FLA's GDN model, 3 seeds) and the parity run (experiments/parity_fla.py, 200 steps: about one pass over the corpus,
# the schedule ending there). Rows land in $OUT as they finish (mqar_gpu.json, parity.jsonl); consoles in $OUT/*.txt.
# Usage: bash experiments/gpu_eval.sh   (carry .whl and .data, as experiments/gpu_parity.sh)
set -uo pipefail
source experiments/device_env.sh
python3 -m linrnn eval mqar --cells gla,deltanet,gdn,kda,gammanet,attention,fla-gdn --widths 64,128,256 \
  --lrs 0.001,0.004 --seeds 0,1,2 --seq-len 256 --pairs 16 --vocab 8192 --steps 1000 --batch-size 64 --heads 2 \
  --jobs "${MQAR_JOBS:-6}" --out "$out/mqar_gpu.json" > "$out/mqar.txt" 2>&1 &
for job in "gdn fla" "gdn linrnn-uniform,linrnn-normal" "kda fla" "kda linrnn-uniform,linrnn-normal"; do
  set -- $job
  python3 experiments/parity_fla.py --family "$1" --variants "$2" --steps 200 --batch 8 --eval-every 25 \
    --out "$out/parity.jsonl" > "$out/parity_$1_${2%%,*}.txt" 2>&1 &
done
wait
bash experiments/pack_triton_cache.sh "$TRITON_CACHE_DIR" "$out/triton_cache.tgz"
tail -n 5 "$out"/*.txt
