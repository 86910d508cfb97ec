#!/usr/bin/env bash
# Nsight Compute on the short convolution's backward kernel (one launch per setting, 4×4096 rows, bf16): where its
# time goes (throughput, stalls, occupancy). Usage: bash experiments/ncu_short_conv.sh TREE BT,BC,WARPS[,SPAN] ...
set -uo pipefail
source experiments/device_env.sh >/dev/null
tree="$1"; shift
for setting in "$@"; do
  echo "== $tree $setting"
  ncu --kernel-name regex:short_conv_bwd --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
      --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section InstructionStats \
      python3 - "$tree" "$setting" <<'PY' 2>&1 | grep -vE "^==PROF==|^\s*$" | cut -c1-150
import sys
sys.path.insert(0, "experiments")
import time_short_conv as tsc
tree, setting = sys.argv[1], tsc.parse_setting(sys.argv[2])
module = tsc.load_module(tree)
x, weight, dy, offset = tsc.inputs(4, 4096, 1)
for _ in range(2):
    tsc.backward(module, setting, x, weight, dy, offset)
PY
done
