#!/usr/bin/env bash
# Two device scripts at once on a two-GPU machine (nvidia-h100-x2): the first on GPU 0 and the first half of the
# CPU cores, the second on GPU 1 and the other half, each with its own wheel folder (SITE) and output folder
# ($OUT/gpu0, $OUT/gpu1, packed at the end into $OUT/gpu0.tgz, $OUT/gpu1.tgz, and one
# Triton cache $OUT/triton_cache.tgz: the device tool brings back at
# most 8 files; the console output in $OUT/gpu0.txt, $OUT/gpu1.txt). A timing run keeps its GPU and its
# cores to itself; the Triton cache folder is shared (Triton writes its files atomically).
# Pair timings only with correctness work: while the other GPU ran FLA's autotuning and compiles, linrnn's compiled
# GDN step read 105k tokens/s against 122k alone (two H200s, 2026-11-25); ratios within one process still hold.
# Usage: bash experiments/gpu_pair.sh "ENV=... bash experiments/gpu_verify.sh" "ENV=... bash experiments/gpu_model.sh"
set -uo pipefail
out="${OUT:-/tmp}"
cores=$(nproc)
half=$((cores / 2))
pins=("0-$((half - 1))" "$half-$((cores - 1))")
commands=("$1" "$2")
for gpu in 0 1; do
  mkdir -p "$out/gpu$gpu"
  CUDA_VISIBLE_DEVICES=$gpu SITE=/tmp/site$gpu OUT="$out/gpu$gpu" taskset -c "${pins[$gpu]}" \
    bash -c "${commands[$gpu]}" > "$out/gpu$gpu.txt" 2>&1 &
done
wait
for gpu in 0 1; do
  echo "===== GPU $gpu (cores ${pins[$gpu]}): ${commands[$gpu]}"
  cat "$out/gpu$gpu.txt"
done
# one Triton cache comes back (the folder is shared: the last one packed holds the most), then each GPU's folder
# without caches as one file
find "$out"/gpu0 "$out"/gpu1 -name triton_cache.tgz -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2 |
  xargs -r -I{} mv {} "$out/triton_cache.tgz"
for gpu in 0 1; do
  find "$out/gpu$gpu" -name triton_cache.tgz -delete
  tar czf "$out/gpu$gpu.tgz" -C "$out/gpu$gpu" . && rm -rf "${out:?}/gpu$gpu"
done
