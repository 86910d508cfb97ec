#!/usr/bin/env bash
# Packs the Triton cache of a device call for the next call (copy the file back to .triton_cache.tgz):
# everything when it packs within 15 MiB (what the device tool brings back), else only the autotuning results
# (*.autotune.json: FLA's autotuning is the slow part of a cold start; kernels recompile in seconds to a minute).
# Usage: bash experiments/pack_triton_cache.sh CACHE_DIR OUT_FILE
set -euo pipefail
cache="$1" packed="$2"
tar czf "$packed" -C "$cache" .
if [ "$(stat -c %s "$packed")" -gt $((15 * 1024 * 1024)) ]; then
  (cd "$cache" && find . -name '*.autotune.json' -print0 | tar czf "$packed" --null -T -)
fi
echo "triton cache: $(du -sh "$cache" | cut -f1) unpacked, $(du -h "$packed" | cut -f1) packed into $packed"
