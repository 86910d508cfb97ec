"""Causal softmax attention as a token mixer: the Transformer baseline beside the recurrence cells.

x ``[B, T, hidden]`` → q, k, v projections (no bias) → heads → RoPE on q and k (on by default) →
``o_t = Σ_{s ≤ t} softmax_s(q_t · k_s / √K) v_s`` per head (``torch.nn.functional.scaled_dot_product_attention``)
→ o_proj (no bias). Registered as ``"attention"`` with ``kind="attention"``: ``build_mixer``, ``build_model``,
``ModelConfig(cell=...)`` and ``param_roles`` take it; ``list_cells`` (the recurrences) does not list it,
``list_mixers`` does.

Options (``MixerOptions``): the head dim is ``head_k_dim``, by default ``hidden_size // num_heads`` rounded down to
an even number when RoPE is on (RoPE turns channel pairs), so that the heads span about the model width: 32 for
``byte-tiny``, 42 for ``paper-256`` (6 heads), 170 for ``340m``. Values use the key head dim (``head_v_dim``, if
given, must equal it). ``use_rope`` (default True here) and ``rope_theta`` as for the cells. ``backend`` is accepted
(the model's norms and MLP read it); attention runs torch's SDPA on every backend. The options of parts attention
does not have (the width ratios ``expand_k``/``expand_v``, short conv, gates, output gate and norm,
``output_multiplier``, ``chunk_size``: ``RECURRENCE_ONLY_OPTIONS``) are refused by ``build_mixer`` unless left at
their defaults; ``linrnn.parametrizations`` leaves ``output_multiplier`` (the GDN-muP paper's §4.3, before a
recurrence's output RMSNorm) at 1 for attention, which has no such norm.

Decode state: ``MixerState.kv``, the keys (after RoPE, at their absolute positions) and values of every token seen,
``[B, H, T_seen, K]`` each; ``position`` is T_seen. The cache grows by one entry per token, so feeding tokens one at a
time (``linrnn.generate``) or a prompt in pieces gives the full forward's outputs. Packed documents with
``output_state`` return one row per document, zero-padded to the longest, ``[D, H, L_max, K]``, with ``position`` the
``[D]`` lengths (what ``linrnn.Engine`` copies into its slots). An ``in_place`` state is a fixed-capacity cache
(``linrnn.Engine``'s slots): ``kv`` ``[B, H, capacity, K]`` buffers and ``position`` ``[B]`` valid entries per row; the
new tokens' keys and values are written at each row's position and the queries attend over that row's valid prefix
(a mask by length: entries past it, stale or unwritten, are never read), with static shapes for a CUDA graph.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from linrnn.errors import UsageError
from linrnn.kernels import eager
from linrnn.recurrences.base import Documents, LinearRNNMixer, MixerConfig, MixerState, apply_rope
from linrnn.recurrences.registry import CellSpec, register_cell


class Attention(nn.Module):
    """Multi-head causal softmax attention with the mixers' forward convention (module docstring)."""

    cell: str  # registry name, set by register

    def __init__(self, config: MixerConfig):
        super().__init__()
        if config.head_v_dim != config.head_k_dim:
            raise UsageError(
                f"attention: values use the key head dim: expected head_v_dim = head_k_dim = {config.head_k_dim}, "
                f"got head_v_dim = {config.head_v_dim} (set head_v_dim along with head_k_dim)"
            )
        self.config = config
        self.num_heads, self.head_k_dim, self.head_v_dim = config.num_heads, config.head_k_dim, config.head_v_dim
        width = config.num_heads * config.head_k_dim
        self.q_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.o_proj = nn.Linear(width, config.hidden_size, bias=False)

    local_param_roles = LinearRNNMixer.local_param_roles  # reads only the registry entry and the parameters

    def forward(self, x: Tensor, state: MixerState | None = None, output_state: bool = False,
                documents: Documents | None = None) -> tuple[Tensor, MixerState | None]:  # fmt: skip
        """x ``[B, T, hidden]`` → (y ``[B, T, hidden]``, new MixerState or None). ``state`` carries the KV cache of
        the tokens before x. With packed ``documents`` (B = 1) no token attends across a document boundary and RoPE
        uses the documents' positions; they start from an empty cache (ValueError otherwise) and, with
        ``output_state``, return each document's cache as one row, zero-padded (module docstring). An ``in_place``
        state is a fixed-capacity cache that the layer writes into and returns (``_forward_in_place``)."""
        if state is not None and not state.in_place and isinstance(state.position, Tensor):
            raise ValueError(
                "attention: this KV cache has rows of different lengths (packed documents' state: position a [B] "
                "tensor, keys zero-padded); it decodes only as in-place buffers (linrnn.Engine's slots). Run each "
                "document on its own to carry its cache"
            )
        q, k, v = (rearrange(proj(x), "b t (h d) -> b t h d", h=self.num_heads)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))  # fmt: skip
        if documents is not None and documents.shard is not None:
            raise ValueError(
                "context parallelism: softmax attention layers cannot split a sequence over ranks yet "
                "(recurrent layers only); train this model without --parallelism.context_parallel_degree"
            )
        if documents is not None:
            if state is not None:
                raise ValueError(
                    "attention: packed documents start from an empty KV cache; got a state. Run each document on "
                    "its own to decode from a cache"
                )
            if self.config.use_rope:
                q, k = (apply_rope(h, 0, self.config.rope_theta, documents.positions) for h in (q, k))
            o = document_attention(q, k, v, documents)
            y = self.o_proj(rearrange(o, "b t h d -> b t (h d)"))
            if not output_state:
                return y, None
            lengths = documents.cu_seqlens.diff().to(x.device)
            return y, MixerState(kv=(per_document(k, documents), per_document(v, documents)), position=lengths)
        if state is not None and state.in_place:
            return self._forward_in_place(q, k, v, state), state
        cache = state.kv if state is not None else None
        seen = 0 if cache is None else cache[0].shape[2]
        if self.config.use_rope:
            q, k = (apply_rope(h, seen, self.config.rope_theta) for h in (q, k))
        q, k, v = (rearrange(h, "b t h d -> b h t d") for h in (q, k, v))
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)  # [B, H, seen + T, K]
        o = causal_attention(q, k, v)
        y = self.o_proj(rearrange(o, "b h t d -> b t (h d)"))
        if not output_state:
            return y, None
        return y, MixerState(kv=(k, v), position=seen + x.shape[1])

    def _forward_in_place(self, q: Tensor, k: Tensor, v: Tensor, state: MixerState) -> Tensor:
        """q, k, v ``[B, T, H, K]`` of T new tokens per row after the ``position`` ``[B]`` valid entries of the
        fixed-capacity buffers ``state.kv`` ``[B, H, C, K]``: RoPE at each row's positions, the keys and values
        written there, each query attending over its row's entries up to itself (a mask by length: a reused row's
        stale entries past it are never read). Static shapes (a CUDA graph); ``position`` is left to the caller to
        advance. → y ``[B, T, hidden]``."""
        if state.kv is None:
            raise ValueError(
                "attention: an in-place state (in_place=True) must hold the KV cache buffers: expected kv = (keys, "
                "values) [B, H, capacity, K], got kv=None"
            )
        k_cache, v_cache = state.kv
        B, T = q.shape[:2]
        capacity = k_cache.shape[2]
        position = state.position
        if not isinstance(position, Tensor):
            position = torch.full((B,), position, dtype=torch.long, device=q.device)
        if self.config.use_rope:
            q, k = (apply_rope(h, position, self.config.rope_theta) for h in (q, k))
        q, k, v = (rearrange(h, "b t h d -> b h t d") for h in (q, k, v))
        at = position[:, None] + torch.arange(T, device=q.device)  # [B, T] the new tokens' positions
        # rows in use stay below the capacity (linrnn.Engine checks each request); an idle engine slot's position
        # runs on past it, and its writes land on its last entry instead of out of bounds
        index = at.clamp_max(capacity - 1)[:, None, :, None].expand_as(k)  # [B, H, T, K]
        k_cache.scatter_(2, index, k.to(k_cache.dtype))
        v_cache.scatter_(2, index, v.to(v_cache.dtype))
        visible = torch.arange(capacity, device=q.device) <= at[:, None, :, None]  # [B, 1, T, C]: key s ≤ query t
        o = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=visible)
        return self.o_proj(rearrange(o, "b h t d -> b t (h d)"))


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Queries ``[B, H, T, K]`` at the last T of the S key positions of k, v ``[B, H, S, K]``: query i sees keys
    ``0 … S − T + i``. SDPA's ``is_causal`` aligns the mask top-left, which is right only for S = T; after a cache
    the mask is explicit."""
    T, S = q.shape[2], k.shape[2]
    if T == S:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)  # [T, S]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def per_document(x: Tensor, documents: Documents) -> Tensor:
    """Packed ``[1, N, H, K]`` → one row per document ``[D, H, L_max, K]``, zero past each document's length."""
    lengths = documents.cu_seqlens.diff()  # on the host
    document = torch.repeat_interleave(torch.arange(len(lengths)), lengths).to(x.device)  # [N]
    rows = x.new_zeros(len(lengths), int(lengths.max()), *x.shape[2:])  # [D, L_max, H, K]
    rows[document, documents.offset] = x[0]
    return rearrange(rows, "d t h k -> d h t k")


def _document_attention(q: Tensor, k: Tensor, v: Tensor, documents: Documents) -> Tensor:
    """q, k, v ``[1, N, H, K]`` of packed documents → o ``[1, N, H, K]``: the block-diagonal causal mask (each token
    sees its own document's tokens up to itself), applied block by block: one causal SDPA call per document, in a
    Python loop over the boundaries (on the host). Written for clarity over speed: it is exact and needs no N × N
    mask (memory and work Σ L_d² instead of N²), but launches once per document, where a varlen flash-attention
    kernel would launch once. It runs eagerly under torch.compile (the document lengths depend on the data)."""
    bounds = documents.cu_seqlens.tolist()
    blocks = []
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        block = (rearrange(h[:, start:end], "b t h d -> b h t d") for h in (q, k, v))
        blocks.append(rearrange(causal_attention(*block), "b h t d -> b t h d"))
    return torch.cat(blocks, dim=1)


document_attention = eager(_document_attention)  # runs eagerly under torch.compile


# MixerOptions of the recurrence mixers' parts that attention does not have: width ratios (head dims are set by
# head_dims), short conv, gates, output gate and norm
RECURRENCE_ONLY_OPTIONS = frozenset(
    ("expand_k", "expand_v", "use_short_conv", "conv_size", "allow_neg_eigval", "gate_low_rank", "norm_eps",
     "output_gate", "output_gate_low_rank", "output_multiplier", "chunk_size")
)  # fmt: skip


def head_dims(hidden_size: int, num_heads: int, options: dict[str, Any]) -> dict[str, int]:
    """``head_k_dim`` as given, else ``hidden_size // num_heads`` (rounded down to even with RoPE); values the same."""
    head = options.get("head_k_dim") or hidden_size // num_heads
    if options.get("head_k_dim") is None and options.get("use_rope", True) and head % 2:
        head -= 1
    return {"head_k_dim": head, "head_v_dim": head}


SPEC = register_cell(
    CellSpec(
        name="attention",
        mixer=Attention,
        structure=None,
        description="Causal softmax attention with RoPE: the Transformer baseline",
        equation="o_t = Σ_{s≤t} softmax_s(q_t·k_s / √K) v_s (state: a KV cache, grows with t)",
        cell_roles={f"{name}.weight": "hidden" for name in ("q_proj", "k_proj", "v_proj", "o_proj")},
        defaults={"use_short_conv": False, "use_rope": True},
        unused_options=RECURRENCE_ONLY_OPTIONS,
        sized_defaults=head_dims,
    )
)
