"""One step of each cell's homogeneous state map, ``S ↦ A_t S`` (FLA orientation, ``S ∈ R^{K×V}``).

With the write switched off, every cell's update is ``S_t = A_t S_{t−1}`` with

| cell | ``A_t`` |
|---|---|
| ``gla`` | ``Diag(α)`` |
| ``deltanet`` | ``I − β e eᵀ`` |
| ``gated_deltanet`` | ``α (I − β e eᵀ)`` |
| ``kda`` | ``(I − β e eᵀ) Diag(α)`` |
| ``gammanet`` | ``(I − β Γ a aᵀ Γ⁻¹) Diag(α) = Γ (I − β a aᵀ) Diag(α) Γ⁻¹`` |
| ``kda_f`` | ``(I − β κ κᵀ) F⁻ᵀ Diag(α) Fᵀ`` |

α is the decay multiplier ``exp(g)`` (per head or per key channel), β the write strength, e / a / κ the unit
erase direction, Γ = Diag(gamma). ``kda_f`` is seed 003's KDA-F with a fixed invertible feature basis F: the seed
writes it in row orientation, ``S_t = S_{t−1} F diag(γ) F⁻¹ (I − β κκᵀ) + β v kᵀ``; the table has its transpose
(same spectrum, same 2-norms). It is not a registered cell, only a variant for exploring the seed's argument.

Each cell declares a certificate: a metric ``‖x‖_M = ‖M⁻¹ x‖₂`` in which every step is non-expansive,
``‖M⁻¹ A_t M‖₂ ≤ 1``. That gives ``ρ(A_t) ≤ 1`` and ``‖A_T ⋯ A_1‖₂ ≤ cond(M)``:

- GLA, DeltaNet, GDN, KDA: M = I. ``‖Diag(α)‖₂ ≤ 1`` for α ∈ [0, 1], and ``I − β e eᵀ`` has eigenvalues 1 (K − 1
  times) and 1 − β, so ``‖I − β e eᵀ‖₂ = 1`` for β ∈ [0, 2] and unit e.
- GammaNet: M = Γ, since ``Γ⁻¹ A Γ = (I − β a aᵀ) Diag(α)``; so ``ρ ≤ 1`` and ``‖∏ A_t‖₂ ≤ cond(Γ)``, while
  ``‖A_t‖₂`` itself can exceed 1.
- KDA-F: M = I holds exactly when F has orthogonal columns (F = QΓ, then ``F⁻ᵀ Diag(α) Fᵀ = Q Diag(α) Qᵀ``); for
  any other F some admissible α, β, κ give ``ρ > 1`` (seed 003's 2 × 2 example: 1.0495). Its natural metric
  (``natural_metric``) is M = F⁻ᵀ, where the decay is ``Diag(α)`` but the erase ``I − β (Fᵀκ)(F⁻¹κ)ᵀ`` is not
  symmetric.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from linrnn.recurrences.registry import canonical_name, list_cells

UNIT_TOLERANCE = 1e-4  # |‖e‖ − 1| accepted for erase directions (bf16 models give ~1e-3 before the cast to fp64)


@dataclass(frozen=True)
class Certificate:
    """The bound a cell's transition should satisfy: non-expansive in ``metric`` (``"euclidean"``: M = I;
    ``"natural"``: the cell's ``natural_metric``), hence ρ ≤ 1 and growth ≤ cond(M)."""

    metric: Literal["euclidean", "natural"]
    text: str


CERTIFICATES = {
    "gla": Certificate("euclidean", "‖A‖₂ ≤ 1"),
    "deltanet": Certificate("euclidean", "‖A‖₂ ≤ 1"),
    "gated_deltanet": Certificate("euclidean", "‖A‖₂ ≤ 1"),
    "kda": Certificate("euclidean", "‖A‖₂ ≤ 1"),
    "gammanet": Certificate("natural", "ρ ≤ 1, ‖Γ⁻¹AΓ‖₂ ≤ 1, growth ≤ cond(Γ)"),
    "kda_f": Certificate("euclidean", "‖A‖₂ ≤ 1 (iff F has orthogonal columns)"),
}

# Which inputs each cell's transition takes (decay: "head" = one α per step, "channel" = α per key channel)
_DECAY = {"gla": "channel", "deltanet": None, "gated_deltanet": "head", "kda": "channel", "gammanet": "channel",
          "kda_f": "channel"}  # fmt: skip
_NEEDS = {
    "gla": {"decay"},
    "deltanet": {"beta", "erase"},
    "gated_deltanet": {"decay", "beta", "erase"},
    "kda": {"decay", "beta", "erase"},
    "gammanet": {"decay", "beta", "erase", "gamma"},
    "kda_f": {"decay", "beta", "erase", "F"},
}


def stability_cells() -> list[str]:
    """The registered cells and the ``kda_f`` variant."""
    return [*list_cells(), "kda_f"]


def stability_cell(name: str) -> str:
    """Canonical name (``gdn`` → ``gated_deltanet``); ``kda_f`` is accepted besides the registered cells."""
    if name == "kda_f":
        return name
    try:
        canonical = canonical_name(name)
    except ValueError as error:
        raise ValueError(f"{error}; the stability checker also knows 'kda_f'") from None
    if canonical not in list_cells():
        raise ValueError(f"{canonical!r} is not a recurrence (it has no transition to check); the stability checker "
                         f"knows {', '.join(stability_cells())}")  # fmt: skip
    return canonical


def decay_kind(cell: str) -> str | None:
    """``"head"``, ``"channel"`` or None (no decay)."""
    return _DECAY[stability_cell(cell)]


def needed_inputs(cell: str) -> set[str]:
    return set(_NEEDS[stability_cell(cell)])


def transition(cell: str, *, decay=None, beta=None, erase=None, gamma=None, F=None) -> Tensor:
    """``A_t`` ``[..., K, K]`` of one step of ``cell`` (module docstring), batched over leading dimensions.

    decay: the multiplier α = exp(g) in [0, 1], not its log: ``[...]`` (one per step) or ``[..., K]`` (per
    channel; GDN takes one per step only). beta: ``[...]`` in [0, 2]. erase: the unit erase direction
    ``[..., K]`` (k for the tied cells, a for GammaNet, κ for kda_f). gamma: the diagonal of Γ ``[..., K]``,
    positive (not its log). F: kda_f's basis ``[..., K, K]``, invertible. Python floats are accepted for decay
    and beta. Computed in the inputs' floating dtype (at least fp32).
    """
    name = stability_cell(cell)
    given = {"decay": decay, "beta": beta, "erase": erase, "gamma": gamma, "F": F}
    for arg, value in given.items():
        if arg in _NEEDS[name] and value is None:
            raise ValueError(f"transition({name!r}): argument {arg!r} is required, got None")
        if arg not in _NEEDS[name] and value is not None:
            takes = ", ".join(sorted(_NEEDS[name]))
            raise ValueError(f"transition({name!r}): this cell takes no {arg!r} (it takes {takes})")
    tensors = [x for x in given.values() if isinstance(x, Tensor)]
    dtype = torch.float64 if not tensors else torch.float32
    for x in tensors:
        dtype = torch.promote_types(dtype, x.dtype if x.is_floating_point() else torch.float32)
    device = tensors[0].device if tensors else None
    as_tensor = {arg: torch.as_tensor(x, dtype=dtype, device=device) for arg, x in given.items() if x is not None}
    size = _key_dim(name, as_tensor)
    _check_values(name, as_tensor, size)
    eye = torch.eye(size, dtype=dtype, device=device)
    decay_matrix = None
    if "decay" in as_tensor:
        alpha = as_tensor["decay"]
        per_channel = _DECAY[name] == "channel" and _is_channel(alpha, as_tensor)
        decay_matrix = torch.diag_embed(alpha) if per_channel else alpha[..., None, None] * eye
    if name == "gla":
        return decay_matrix
    beta, e = as_tensor["beta"][..., None, None], as_tensor["erase"]
    left, right = e, e  # the erase is I − β left rightᵀ
    if name == "gammanet":
        left, right = as_tensor["gamma"] * e, e / as_tensor["gamma"]
    erase_matrix = eye - beta * left[..., :, None] * right[..., None, :]
    if name == "deltanet":
        return erase_matrix
    if name == "kda_f":
        basis = as_tensor["F"]
        decay_matrix = torch.linalg.solve(basis.mT, decay_matrix @ basis.mT)  # F⁻ᵀ Diag(α) Fᵀ
    return erase_matrix @ decay_matrix


def natural_metric(cell: str, *, gamma=None, F=None) -> Tensor | None:
    """M of the cell's natural norm ``‖M⁻¹ A M‖₂``: Diag(gamma) for GammaNet, F⁻ᵀ for kda_f, None (Euclidean)
    for the others."""
    name = stability_cell(cell)
    if name == "gammanet":
        if gamma is None:
            raise ValueError("natural_metric('gammanet'): argument 'gamma' is required, got None")
        return torch.diag_embed(torch.as_tensor(gamma))
    if name == "kda_f":
        if F is None:
            raise ValueError("natural_metric('kda_f'): argument 'F' is required, got None")
        basis = torch.as_tensor(F)
        return torch.linalg.inv(basis).mT
    return None


def certificate_metric(cell: str, *, gamma=None, F=None) -> Tensor | None:
    """The M of the cell's certificate (``CERTIFICATES``): the natural metric or None (Euclidean)."""
    name = stability_cell(cell)
    return natural_metric(name, gamma=gamma, F=F) if CERTIFICATES[name].metric == "natural" else None


def _is_channel(alpha: Tensor, inputs: dict[str, Tensor]) -> bool:
    """A decay is per channel ([..., K]) when it has one more dimension than beta, or when there is no beta (GLA)."""
    if "beta" not in inputs:
        return True
    return alpha.dim() == inputs["beta"].dim() + 1


def _key_dim(name: str, inputs: dict[str, Tensor]) -> int:
    for arg in ("erase", "gamma"):
        if arg in inputs:
            if inputs[arg].dim() == 0:
                raise ValueError(f"transition({name!r}): argument {arg!r} must be [..., K], got a scalar")
            return inputs[arg].shape[-1]
    if name == "gla":
        if inputs["decay"].dim() == 0:
            raise ValueError("transition('gla'): argument 'decay' must be per channel [..., K], got a scalar")
        return inputs["decay"].shape[-1]
    raise AssertionError(name)  # every other cell needs erase


def _check_values(name: str, inputs: dict[str, Tensor], size: int) -> None:
    def fail(arg: str, expected: str, actual: str):
        raise ValueError(f"transition({name!r}): argument {arg!r} must be {expected}, got {actual}")

    for arg, x in inputs.items():
        if not torch.isfinite(x).all():
            fail(arg, "finite", "non-finite values")
    if "decay" in inputs:
        alpha = inputs["decay"]
        if _DECAY[name] == "head" and "beta" in inputs and alpha.dim() > inputs["beta"].dim():
            fail("decay", f"one multiplier per step (shape of beta, {list(inputs['beta'].shape)})",
                 f"shape {list(alpha.shape)}")  # fmt: skip
        if _DECAY[name] == "channel" and _is_channel(alpha, inputs) and alpha.shape[-1] != size:
            fail("decay", f"[..., K] with K = {size}", f"shape {list(alpha.shape)}")
        if (alpha < 0).any() or (alpha > 1).any():
            fail("decay", "the multiplier exp(g) in [0, 1]", f"values in [{alpha.min():.4g}, {alpha.max():.4g}]")
    if "beta" in inputs:
        beta = inputs["beta"]
        if (beta < 0).any() or (beta > 2).any():
            fail("beta", "in [0, 2]", f"values in [{beta.min():.4g}, {beta.max():.4g}]")
    if "erase" in inputs:
        norms = inputs["erase"].norm(dim=-1)
        if ((norms - 1).abs() > UNIT_TOLERANCE).any():
            fail("erase", "unit vectors", f"norms in [{norms.min():.4g}, {norms.max():.4g}]")
    if "gamma" in inputs:
        gamma = inputs["gamma"]
        if gamma.shape[-1] != size:
            fail("gamma", f"[..., K] with K = {size}", f"shape {list(gamma.shape)}")
        if (gamma <= 0).any():
            fail("gamma", "the positive diagonal of Γ (not log Γ)", f"minimum {gamma.min():.4g}")
    if "F" in inputs:
        basis = inputs["F"]
        if basis.dim() < 2 or basis.shape[-2:] != (size, size):
            fail("F", f"[..., {size}, {size}]", f"shape {list(basis.shape)}")
        singular_values = torch.linalg.svdvals(basis)  # [..., K], descending
        # singular in its dtype: cond(F) beyond 1 / (K eps), as numpy's matrix_rank decides
        if (singular_values[..., -1] <= size * torch.finfo(basis.dtype).eps * singular_values[..., 0]).any():
            fail("F", "invertible", "a singular matrix")
