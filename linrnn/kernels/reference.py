"""The generalized delta-rule recurrence as a plain sequential loop: the definition.

Per head, state ``S ∈ R^{K×V}`` (FLA orientation), for t = 1..T::

    S_t = (I − β_t e_t (b_t ⊙ e_t)ᵀ) Diag(exp g_t) S_{t−1} + β_t w_t v_tᵀ
    o_t = S_tᵀ (scale · q_t)

``g`` is a log-decay, per head ``[B, T, H]`` or per key channel ``[B, T, H, K]``
(``None``: no decay). ``e`` is the erase direction (``None``: no erase, as in
GLA; pass ``e=w`` for the tied case). ``beta`` is the write strength (``None``:
1, as in GLA's plain ``w vᵀ`` write). ``erase_gate`` is b, the erase's gate per key channel on the side that
reads the state (``None``: 1; Gated DeltaNet-2).

Inputs are trusted here (``linrnn.kernels.ops`` validates them). The loop runs
in fp64 for fp64 inputs and fp32 otherwise; outputs come back in ``v``'s dtype,
the final state in the compute dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp64 stays fp64; every other float dtype accumulates in fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def recurrence_reference(
    q: Tensor,
    w: Tensor,
    v: Tensor,
    e: Tensor | None = None,
    g: Tensor | None = None,
    beta: Tensor | None = None,
    *,
    erase_gate: Tensor | None = None,
    scale: float,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Sequential loop over time; see the module docstring for the recurrence.

    Shapes: q, w, e ``[B, T, H, K]``; v ``[B, T, H, V]``; g ``[B, T, H]`` or
    ``[B, T, H, K]``; beta ``[B, T, H]``; initial_state ``[N, H, K, V]`` with
    N = B, or N = number of sequences when ``cu_seqlens`` (B = 1) is given.
    """
    if cu_seqlens is None:
        o, final = _loop(q, w, v, e, g, beta, erase_gate, scale, initial_state)
        return o, final if output_final_state else None

    bounds = cu_seqlens.tolist()
    outputs, finals = [], []
    for n, (start, end) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        piece = slice(start, end)
        o, final = _loop(
            q[:, piece],
            w[:, piece],
            v[:, piece],
            None if e is None else e[:, piece],
            None if g is None else g[:, piece],
            None if beta is None else beta[:, piece],
            None if erase_gate is None else erase_gate[:, piece],
            scale,
            None if initial_state is None else initial_state[n : n + 1],
        )
        outputs.append(o)
        finals.append(final)
    return torch.cat(outputs, dim=1), torch.cat(finals) if output_final_state else None


def _loop(q, w, v, e, g, beta, erase_gate, scale, initial_state):
    dtype = compute_dtype(q.dtype)
    batch, steps, heads, key_dim = q.shape
    value_dim, out_dtype = v.shape[-1], v.dtype
    q, w, v = (x.to(dtype) for x in (q, w, v))
    e = None if e is None else e.to(dtype)
    g = None if g is None else g.to(dtype)
    beta = None if beta is None else beta.to(dtype)
    read = None if e is None else e if erase_gate is None else e * erase_gate.to(dtype)  # reads the state

    if initial_state is None:
        state = q.new_zeros(batch, heads, key_dim, value_dim)
    else:
        state = initial_state.to(dtype)
    outputs = []
    for t in range(steps):
        if g is not None:
            decay = g[:, t].exp()  # [B, H] or [B, H, K]
            decay = decay[..., None, None] if decay.dim() == 2 else decay[..., None]
            state = decay * state
        strength = 1.0 if beta is None else beta[:, t, :, None, None]  # [B, H, 1, 1]
        if e is not None:
            recalled = torch.einsum("bhk,bhkv->bhv", read[:, t], state)
            state = state - strength * e[:, t, :, :, None] * recalled[:, :, None, :]
        state = state + strength * w[:, t, :, :, None] * v[:, t, :, None, :]
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, state))
    o = torch.stack(outputs, dim=1) if outputs else v.new_zeros(batch, 0, heads, value_dim)
    return o.to(out_dtype), state
