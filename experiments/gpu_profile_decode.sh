#!/usr/bin/env bash
# One device call: where the decoding step's time goes (experiments/profile_decode.py), 340M GDN at 1 and 256
# slots, for this tree and, when BASE_TREE names a folder holding another tree's linrnn package (e.g. `mkdir -p .base
# && git archive HEAD linrnn | tar -x -C .base`, carried), for that one first. Writes $OUT/profile_decode.txt.
set -uo pipefail
source experiments/device_env.sh  # wheels, PYTHONPATH, Triton cache, $out
for tree in ${BASE_TREE:-} "$PWD"; do
  for slots in ${DECODE_SLOTS:-1 256}; do
    echo "== tree $tree, $slots slots" | tee -a "$out/profile_decode.txt"
    PYTHONPATH="$SITE:$tree:$PWD" timeout -k 10 150 python3 experiments/profile_decode.py --cell gdn --slots "$slots" \
      ${DECODE_EXTRA:-} 2>&1 | tail -22 | tee -a "$out/profile_decode.txt"
  done
done
