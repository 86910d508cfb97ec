#!/usr/bin/env bash
# One device call: experiments/tune_chunk.py (the chunk ops' per-kernel times under launch-setting variants) and its
# summary. Carry .whl and .triton_cache.tgz. TUNE_ARGS: more arguments for tune_chunk.py (cells, shapes, variants);
# TUNE_SECONDS (default 500) bounds the run. Writes $OUT/tune.jsonl, $OUT/tune.txt and $OUT/triton_cache.tgz.
set -uo pipefail
source experiments/device_env.sh  # wheels, PYTHONPATH, Triton cache, $out
# shellcheck disable=SC2086
timeout -k 10 "${TUNE_SECONDS:-500}" python3 experiments/tune_chunk.py ${TUNE_ARGS:-} > "$out/tune.jsonl" 2> "$out/tune.err"
echo "tune_chunk.py exit $?"
tail -5 "$out/tune.err"
python3 experiments/tune_chunk.py --report "$out/tune.jsonl" | tee "$out/tune.txt"
bash experiments/pack_triton_cache.sh "$TRITON_CACHE_DIR" "$out/triton_cache.tgz"
