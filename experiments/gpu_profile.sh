#!/usr/bin/env bash
# One device call: per-kernel profile of the chunkwise ops (experiments/profile_chunk.py), optionally FLA's too.
# Usage (device tool; carry .whl and .triton_cache.tgz when you have one):
#   bash experiments/gpu_profile.sh [profile_chunk.py arguments]     e.g. --cells deltanet --fla
# Writes $OUT/profile.log and $OUT/triton_cache.tgz (autotune results; copy it to .triton_cache.tgz).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "${SITE:=/tmp/site}" .whl/*.whl || exit 1
export PYTHONPATH="$SITE:$PWD" FLA_DISABLE_BACKEND_DISPATCH=1 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR="$PWD/.triton_cache" TRITON_CACHE_AUTOTUNING=1
mkdir -p "$TRITON_CACHE_DIR"
if [ -f .triton_cache.tgz ]; then tar xzf .triton_cache.tgz -C "$TRITON_CACHE_DIR"; fi
timeout -k 10 "${PROFILE_S:-540}" python3 experiments/profile_chunk.py "$@" 2>&1 | tee "$OUT/profile.log"
status=${PIPESTATUS[0]}
(cd "$TRITON_CACHE_DIR" && find . -name '*.autotune.json' -print0 | tar czf "$OUT/triton_cache.tgz" --null -T -)
exit "$status"
