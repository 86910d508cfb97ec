#!/usr/bin/env bash
# One device call: scripts/tune_chunk.py (the chunk ops' per-kernel times under launch-setting variants) and its
# summary. Carry .whl and .triton_cache.tgz. TUNE_ARGS: more arguments for tune_chunk.py (cells, shapes, variants);
# TUNE_SECONDS (default 500) bounds the run. Writes $OUT/tune.jsonl, $OUT/tune.txt and $OUT/triton_cache.tgz.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "${SITE:=/tmp/site}" .whl/*.whl || exit 1
out="${OUT:-/tmp}"
export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR="$PWD/.triton_cache" TRITON_CACHE_AUTOTUNING=1 TRITON_STORE_BINARY_ONLY=1
mkdir -p "$TRITON_CACHE_DIR"
if [ -f .triton_cache.tgz ]; then tar xzf .triton_cache.tgz -C "$TRITON_CACHE_DIR"; fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# shellcheck disable=SC2086
timeout -k 10 "${TUNE_SECONDS:-500}" python3 scripts/tune_chunk.py ${TUNE_ARGS:-} > "$out/tune.jsonl" 2> "$out/tune.err"
echo "tune_chunk.py exit $?"
tail -5 "$out/tune.err"
python3 scripts/tune_chunk.py --report "$out/tune.jsonl" | tee "$out/tune.txt"
bash scripts/pack_triton_cache.sh "$TRITON_CACHE_DIR" "$out/triton_cache.tgz"
