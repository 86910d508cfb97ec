# Sourced by the device scripts (gpu_*.sh) first: the carried wheels (.whl) into $SITE, the import path, the Triton
# cache folder (with the carried .triton_cache.tgz unpacked into it; pack it back with pack_triton_cache.sh), `out`
# (= $OUT, the folder the device tool brings back) and the GPU's name. FLA's backend dispatch is off for the scripts
# that time FLA (its Hopper guard lifted for speed only; RESULTS.md). Sourced again in the same shell environment
# (one call running two scripts), it installs and unpacks nothing more: the first's processes may be reading them.
out="${OUT:-/tmp}"
export PYTHONPATH="${SITE:=/tmp/site}:$PWD" FLA_DISABLE_BACKEND_DISPATCH=1 PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR="$PWD/.triton_cache" TRITON_CACHE_AUTOTUNING=1 TRITON_STORE_BINARY_ONLY=1
if [ -z "${DEVICE_ENV_READY:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || exit 1
  mkdir -p "$TRITON_CACHE_DIR"
  if [ -f .triton_cache.tgz ]; then tar xzf .triton_cache.tgz -C "$TRITON_CACHE_DIR"; fi
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  export DEVICE_ENV_READY=1
fi
