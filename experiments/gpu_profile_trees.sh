#!/usr/bin/env bash
# One device call: experiments/profile_chunk.py (per-kernel times, forward and forward+backward, call + sync
# medians) on this tree and on an older linrnn, per shape, so a kernel change is read against its baseline on the
# same machine. FLA's op is profiled with this tree's run only.
# Usage (device tool; carry .whl, .triton_cache.tgz and the old tree, made here with
#   mkdir .old && git archive OLD_COMMIT linrnn | tar x -C .old   (.old/ in .git/info/exclude, then carry it)):
#   PROFILE_SHAPES="8x4096:16:128 4x4096:6:256" bash experiments/gpu_profile_trees.sh .old --cells gated_deltanet kda
# A shape is BxT:H:V with K = 128. Writes $OUT/profile_<tree>_<shape>.log and $OUT/triton_cache.tgz.
set -uo pipefail
old="$(cd "$1" && pwd)"
shift
source experiments/device_env.sh  # wheels, PYTHONPATH, Triton cache, $out
for shape in ${PROFILE_SHAPES:-8x4096:16:128}; do
  IFS=: read -r bt heads value_dim <<< "$shape"
  for tree in new old; do
    root="$PWD" extra="--fla"
    if [ "$tree" = old ]; then root="$old" extra=""; fi
    # shellcheck disable=SC2086
    PYTHONPATH="$root:$SITE" timeout -k 10 "${PROFILE_S:-200}" python3 experiments/profile_chunk.py --shape "$bt" \
      --heads "$heads" --value-dim "$value_dim" "$@" $extra > "$out/profile_${tree}_$bt.log" 2>&1
    echo "== $tree tree, $shape (exit $?)"
    grep -v Warning "$out/profile_${tree}_$bt.log" | grep -v "_warn_once" | grep -v "^  "
  done
done
bash experiments/pack_triton_cache.sh "$TRITON_CACHE_DIR" "$out/triton_cache.tgz"
