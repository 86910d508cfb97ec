"""Context parallelism: one batch of sequences split along time over the ranks of a process group.

Rank r of R holds the r-th contiguous slice of every row (``[B, T / R]``, the rows folded into packed documents as
in training, ``linrnn.recurrences.base.Documents``). A row's first document on rank r > 0 usually began on an
earlier rank: its recurrent state and its short-conv history come from there. ``Shard`` describes that layout;
the two functions below are what a mixer does differently under it.

**The recurrence** (``chained_recurrence``). For every cell the state after a stretch of tokens is affine in the
state before it: ``S_out = P S_in + L`` (``S`` is ``[K, V]`` per head; ``P`` ``[K, K]`` is the product of the
stretch's transitions — decays and erasures act on the key side — and ``L`` is the stretch's state from zero).
Each output is linear in the state it reads, ``o_t = scale · S_tᵀ q_t``. Two passes of the cell's own op give all
of it: the values from a zero state give the outputs ``o_loc`` and the final state ``L``; ``K`` columns of zero
values from initial state ``I`` for a continued first document (zeros elsewhere) carry ``P_t`` in the state, so
their outputs are ``b_t = scale · P_tᵀ q_t`` and the row's last document ends at ``P`` (``P = 0`` when a document
starts on this rank: nothing before it reaches past that start). Two passes rather than one at width ``V + K``:
each stays within the Triton kernels' widths (``ops.MAX_TRITON_DIM``). The ranks exchange their ``(L, P)`` per row
(an all-gather of ``B · H · K · (V + K)`` numbers), each chains those of the ranks before it into its own incoming
state ``S_in`` (``S_in(0) = 0``, ``S_in(r + 1) = P_r S_in(r) + L_r``) and corrects its outputs,
``o_t = o_loc_t + S_inᵀ b_t`` (``b_t = 0`` outside continued documents). A gate on the value side (GDN-2's write
gate ``w``) scales only what is written, not the transition: the second pass takes ones for it. The backward runs
through the op's own backward, the chain's matmuls and the all-gather's (an all-reduce of the gradients). Cost: the
recurrence at width ``V + K`` instead of ``V``, plus ``R − 1`` small matmuls.

**The short convolution** (``convolve_with_halo``). Each rank passes the last ``W − 1`` inputs of every row to the
next; a row's inputs are convolved after that halo, with each token's true position in its document bounding its
taps (the caller's positions), and the halo's own outputs dropped.

Both need every rank to take part in the same order (collectives); the model calls them in layer order, and every
rank's result depends on its gather (rank 0's through a product with 0) so that every rank's backward joins the
same all-reduces.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from linrnn.kernels import eager
from linrnn.kernels.structure import INPUTS

VALUE_SIDE = tuple(name for name, (shape, _) in INPUTS.items() if shape is not None and shape.endswith("V]"))


@dataclass
class Shard:
    """This rank's slice of a batch split along time. ``rows``: B; ``continued`` ``[B]`` (host, bool): the row's
    first token is not a document start (its document began on an earlier rank); ``first_document`` and
    ``last_document`` ``[B]`` (host): the indices, among the packed documents, of each row's first and last one."""

    group: dist.ProcessGroup
    rank: int
    size: int
    rows: int
    continued: Tensor
    first_document: Tensor
    last_document: Tensor


class _AllGather(torch.autograd.Function):
    """``[R, *x.shape]``: every rank's ``x``; the gradient of each rank's ``x`` sums what every rank's loss gives
    it (an all-reduce)."""

    @staticmethod
    def forward(ctx, x: Tensor, group: dist.ProcessGroup, rank: int, size: int) -> Tensor:
        ctx.group, ctx.rank = group, rank
        x = x.contiguous()
        out = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(out, x, group=group)
        return torch.stack(out)

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad[ctx.rank], None, None, None


def all_gather(x: Tensor, shard: Shard) -> Tensor:
    """Every rank's ``x`` stacked ``[R, ...]``, differentiable."""
    return _AllGather.apply(x, shard.group, shard.rank, shard.size)


@eager  # data-dependent indexing on the host layout, collectives (the op is a custom op either way)
def chained_recurrence(op, q: Tensor, k: Tensor, v: Tensor, gates: dict[str, Tensor], shard: Shard,
                       cu_seqlens: Tensor, **options) -> Tensor:  # fmt: skip
    """The outputs ``[1, N, H, V]`` of ``op`` (a cell's op, ``linrnn.ops``) on this rank's packed documents
    (``cu_seqlens``, rows folded: N = B · T_local) as if each row ran whole (module docstring). ``options``: the op's
    keyword arguments besides the streams, gates, state and boundaries (``scale``, ``backend``, ``chunk_size``)."""
    heads, k_dim, v_dim = q.shape[2], q.shape[3], v.shape[3]
    documents = cu_seqlens.numel() - 1
    dtype = torch.promote_types(v.dtype, torch.float32)  # states and the correction: fp32 at least
    local, from_zero = op(q, k, v, **gates, output_final_state=True, cu_seqlens=cu_seqlens, **options)
    # gates on the value side (a write gate per value channel) scale only what is written: any value does for the
    # zero values of the second pass
    transition_gates = {name: x.new_ones(*x.shape[:3], k_dim) if name in VALUE_SIDE else x
                        for name, x in gates.items()}  # fmt: skip
    identity = torch.zeros(documents, heads, k_dim, k_dim, device=v.device, dtype=dtype)
    continued = shard.first_document[shard.continued]
    if continued.numel():
        identity[continued.to(v.device)] = torch.eye(k_dim, device=v.device, dtype=dtype)
    basis, transition = op(q, k, v.new_zeros(*v.shape[:3], k_dim), **transition_gates, initial_state=identity,
                           output_final_state=True, cu_seqlens=cu_seqlens, **options)  # fmt: skip
    final = torch.cat([from_zero.to(dtype), transition.to(dtype)], dim=-1)  # [D, H, K, V + K]: (L | P)
    last = final[shard.last_document.to(v.device)]  # [B, H, K, V + K]: the rows' (L | P)
    gathered = all_gather(last, shard)  # [R, B, H, K, V + K]
    incoming = gathered[0, ..., :v_dim] * 0  # S_in(0) = 0, joined to the graph: every rank's backward all-reduces
    for r in range(shard.rank):  # S_in(r + 1) = P_r S_in(r) + L_r
        incoming = gathered[r, ..., v_dim:] @ incoming + gathered[r, ..., :v_dim]
    basis = basis.reshape(shard.rows, -1, heads, k_dim).to(dtype)
    correction = torch.einsum("bthk,bhkv->bthv", basis, incoming).reshape(local.shape)
    return (local.to(dtype) + correction).to(local.dtype)


@eager
def convolve_with_halo(conv, x: Tensor, shard: Shard, positions: Tensor, keep: int) -> Tensor:
    """``conv(x_ext, offset_ext)`` (a causal conv taking per-token document offsets, ``linrnn.kernels.short_conv``)
    over this rank's rows ``x`` ``[1, B · T_local, C]`` preceded by the previous rank's last ``keep`` inputs of each
    row (zeros on rank 0), the halo's outputs dropped: ``[1, B · T_local, C]``. ``positions`` ``[B · T_local]``: each
    token's position in its document within the whole row, which bounds its taps."""
    if keep == 0:
        return conv(x, positions)
    rows = x.reshape(shard.rows, -1, x.shape[-1])  # [B, T_local, C]
    tails = all_gather(rows[:, rows.shape[1] - keep :], shard)  # [R, B, keep, C]
    halo = tails[shard.rank - 1] if shard.rank > 0 else tails[0] * 0  # rank 0: zeros, joined to the graph (above)
    extended = torch.cat([halo, rows], dim=1).reshape(1, -1, x.shape[-1])
    offsets = positions.reshape(shard.rows, -1)
    offsets = torch.cat([offsets.new_zeros(shard.rows, keep), offsets], dim=1).reshape(-1)
    y = conv(extended, offsets).reshape(shard.rows, -1, x.shape[-1])
    return y[:, keep:].reshape(x.shape)
