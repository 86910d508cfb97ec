#!/usr/bin/env bash
# Learning parity with FLA's GDN and KDA models on one GPU (experiments/parity_fla.py): four processes at once (FLA's
# GDN, linrnn's GDN in both conv inits, the same for KDA; three seeds each), then the fixed-batch probe. Rows land in
# $OUT/parity.jsonl and $OUT/fixed_batch.jsonl; each process's console in $OUT/<name>.txt. Needs the embedded corpus
# in .data/shakespeare (a copy of `linrnn data prepare`'s folder) and the wheels of device_env.sh (fla-core and
# flash-linear-attention 0.6.0, pydantic).
# Usage: [PARITY_JOBS='gdn:fla kda:fla'] [PARITY_PROBE=0] bash experiments/gpu_parity.sh [extra parity_fla.py arguments]
set -uo pipefail
extra=("$@")
source experiments/device_env.sh
jobs=${PARITY_JOBS:-"gdn:fla gdn:linrnn-uniform,linrnn-normal kda:fla kda:linrnn-uniform,linrnn-normal"}
for job in $jobs; do
  family=${job%%:*} variants=${job#*:}
  python3 experiments/parity_fla.py --family "$family" --variants "$variants" --out "$out/parity.jsonl" "${extra[@]}" \
    > "$out/parity_${family}_${variants%%,*}.txt" 2>&1 &
done
wait
[ "${PARITY_PROBE:-1}" = 1 ] && python3 experiments/parity_fla.py --family gdn --variants linrnn-uniform,linrnn-normal,fla \
  --seeds 0 --steps 14 --eval-every 1 --probe fixed-batch --out "$out/fixed_batch.jsonl" > "$out/fixed_batch.txt" 2>&1
bash experiments/pack_triton_cache.sh "$TRITON_CACHE_DIR" "$out/triton_cache.tgz"
tail -n 3 "$out"/*.txt
