"""``python -m linrnn.train`` with FLA's ``chunk_gated_delta_rule`` in place of linrnn's GDN op: speed only.

For the timing in benchmarks/RESULTS.md ("Training through torchtitan"): the same model, data and torchtitan
setup, with only the recurrence kernel swapped. FLA 0.6.0 refuses the backward of its gated kernels on Hopper with
Triton 3.6 (its issue #640: wrong results); this lifts that guard, so the losses of such a run are not to be
trusted, only its tokens/s. Usage (torchrun or not): ``python experiments/train_fla.py --config gdn_340m_sp ...``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from linrnn.training import compat  # noqa: E402

compat.install()

import fla.ops.common.chunk_o  # noqa: E402
from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: E402

from linrnn import train  # noqa: E402
from linrnn.recurrences.gated_deltanet import GatedDeltaNet  # noqa: E402

fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 = True  # lifts FLA's Hopper guard: speed only


def fla_gated_delta_rule(q, k, v, g, beta, *, initial_state=None, output_final_state=False, cu_seqlens=None, **unused):
    """linrnn's op signature on FLA's kernel (q, k already L2-normalised by the mixer)."""
    return chunk_gated_delta_rule(
        q,
        k,
        v,
        g.float(),
        beta.to(q.dtype),
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
    )


GatedDeltaNet.op = staticmethod(fla_gated_delta_rule)

if __name__ == "__main__":
    sys.exit(train.main())
