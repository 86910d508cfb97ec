"""One step of each cell's homogeneous state map, ``S ↦ A_t S`` (FLA orientation, ``S ∈ R^{K×V}``), read from the
cell's structure (``CellSpec.structure``).

With the write switched off, a cell's update is ``S_t = A_t S_{t−1}`` with

    A_t = (I − β left rightᵀ) D_t

- ``D_t``: ``Diag(α)`` (decay per key channel), ``α I`` (per head) or ``I`` (no decay); α = exp(g);
- no erase: ``A_t = D_t``; an erase of strength β (b = 1): left = right = e, the unit erase direction (k for a tied
  erase, a for a decoupled one); a per-channel erase gate b (Gated DeltaNet-2, no β): left = e, right = b ⊙ e;
  conjugated by Γ (GammaNet): left = Γe, right = Γ⁻¹e, so ``A_t = Γ (I − β e eᵀ) D_t Γ⁻¹``.

A per-head decay without an erase (Mamba-2) is ``α I``, which has the spectrum and norms of the 1 × 1 matrix
``[α]``; that is what ``transition`` returns for it.

``kda_f`` is a variant, not a registered cell: KDA-F from Lucas Sun's GammaNet note (docs/design.md, "Sources"),
KDA with a fixed invertible feature basis F, ``A_t = (I − β κ κᵀ) F⁻ᵀ Diag(α) Fᵀ`` (the transpose of the note's row
orientation, ``S_t = S_{t−1} F diag(γ) F⁻¹ (I − β κκᵀ) + β v kᵀ``: same spectrum, same 2-norms), for exploring the
note's argument.

Each structure has a certificate (``linrnn.kernels.structure.certificate``): a metric ``‖x‖_M = ‖M⁻¹ x‖₂`` in which
every step is non-expansive, ``‖M⁻¹ A_t M‖₂ ≤ 1``. That gives ``ρ(A_t) ≤ 1`` and ``‖A_T ⋯ A_1‖₂ ≤ cond(M)``:

- M = I (euclidean) without conjugation or erase gate: ``‖Diag(α)‖₂ ≤ 1`` for α ∈ [0, 1], and ``I − β e eᵀ`` has
  eigenvalues 1 (K − 1 times) and 1 − β, so ``‖I − β e eᵀ‖₂ = 1`` for β ∈ [0, 2] and unit e.
- GammaNet: M = Γ, since ``Γ⁻¹ A Γ = (I − β a aᵀ) Diag(α)``; so ``ρ ≤ 1`` and ``‖∏ A_t‖₂ ≤ cond(Γ)``, while
  ``‖A_t‖₂`` itself can exceed 1.
- A per-channel erase gate: ``I − e (b ⊙ e)ᵀ`` is not symmetric; its eigenvalues are 1 (K − 1 times) and
  ``1 − Σ b_i e_i²`` ∈ [−1, 1], but its norm exceeds 1 (K = 2, e = (1, 1)/√2, b = (1, 0): 1.14). The certificate
  claims ρ ≤ 1 per step only ("spectral"); norms and products are measured, not bounded.
- KDA-F: M = I holds exactly when F has orthogonal columns (F = QΓ, then ``F⁻ᵀ Diag(α) Fᵀ = Q Diag(α) Qᵀ``); for
  any other F some admissible α, β, κ give ``ρ > 1`` (the note's 2 × 2 example: 1.0495). Its natural metric
  (``natural_metric``) is M = F⁻ᵀ, where the decay is ``Diag(α)`` but the erase ``I − β (Fᵀκ)(F⁻¹κ)ᵀ`` is not
  symmetric.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linrnn.kernels.structure import Certificate, Structure
from linrnn.recurrences.registry import canonical_name, get_cell, list_cells

UNIT_TOLERANCE = 1e-4  # |‖e‖ − 1| accepted for erase directions (bf16 models give ~1e-3 before the cast to fp64)

KDA_F = Structure(decay="channel", erase="tied")  # kda_f's structure, besides its basis F
KDA_F_CERTIFICATE = Certificate("euclidean", "‖A‖₂ ≤ 1 (iff F has orthogonal columns)")


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


def structure_of(cell: str) -> Structure:
    name = stability_cell(cell)
    return KDA_F if name == "kda_f" else get_cell(name).structure


def cell_certificate(cell: str) -> Certificate:
    """The certificate the checker holds ``cell`` to (``CellSpec.certificate``; kda_f's own)."""
    name = stability_cell(cell)
    return KDA_F_CERTIFICATE if name == "kda_f" else get_cell(name).certificate


def decay_kind(cell: str) -> str | None:
    """``"head"``, ``"channel"`` or None (no decay)."""
    decay = structure_of(cell).decay
    return None if decay == "none" else decay


def needed_inputs(cell: str) -> set[str]:
    """The inputs of ``transition`` for ``cell``: of ``decay``, ``beta``, ``erase``, ``erase_gate``, ``gamma``,
    ``F``."""
    structure = structure_of(cell)
    needs = set()
    if structure.decay != "none":
        needs.add("decay")
    if structure.erase != "off":
        needs.add("erase")
        if structure.erase_gate == "channel":
            needs.add("erase_gate")
        if structure.has_beta:
            needs.add("beta")
    if structure.conjugated:
        needs.add("gamma")
    if stability_cell(cell) == "kda_f":
        needs.add("F")
    return needs


def transition(cell: str, *, decay=None, beta=None, erase=None, erase_gate=None, gamma=None, F=None) -> Tensor:
    """``A_t`` ``[..., K, K]`` of one step of ``cell`` (module docstring), batched over leading dimensions.

    decay: the multiplier α = exp(g) in [0, 1], not its log: ``[...]`` (one per step) or ``[..., K]`` (per
    channel; a per-head cell takes one per step only). beta: ``[...]`` in [0, 2]. erase: the unit erase direction
    ``[..., K]`` (k for the tied cells, a for GammaNet, κ for kda_f). erase_gate: b ``[..., K]`` in [0, 2] (cells
    with a per-channel erase gate). gamma: the diagonal of Γ ``[..., K]``, positive (not its log). F: kda_f's basis
    ``[..., K, K]``, invertible. Python floats are accepted for decay and beta. Computed in the inputs' floating
    dtype (at least fp32).
    """
    name = stability_cell(cell)
    needs = needed_inputs(name)
    given = {"decay": decay, "beta": beta, "erase": erase, "erase_gate": erase_gate, "gamma": gamma, "F": F}
    for arg, value in given.items():
        if arg in needs and value is None:
            raise ValueError(f"transition({name!r}): argument {arg!r} is required, got None")
        if arg not in needs and value is not None:
            takes = ", ".join(sorted(needs))
            raise ValueError(f"transition({name!r}): this cell takes no {arg!r} (it takes {takes})")
    tensors = [x for x in given.values() if isinstance(x, Tensor)]
    dtype = torch.float64 if not tensors else torch.float32
    for x in tensors:
        dtype = torch.promote_types(dtype, x.dtype if x.is_floating_point() else torch.float32)
    device = tensors[0].device if tensors else None
    as_tensor = {arg: torch.as_tensor(x, dtype=dtype, device=device) for arg, x in given.items() if x is not None}
    structure = structure_of(name)
    size = _key_dim(name, structure, as_tensor)
    _check_values(name, structure, as_tensor, size)
    eye = torch.eye(size, dtype=dtype, device=device)
    decay_matrix = None
    if "decay" in as_tensor:
        alpha = as_tensor["decay"]
        per_channel = structure.decay == "channel" and _is_channel(alpha, as_tensor)
        decay_matrix = torch.diag_embed(alpha) if per_channel else alpha[..., None, None] * eye
    if structure.erase == "off":
        return decay_matrix
    e = as_tensor["erase"]
    left, right = e, e  # the erase is I − β left rightᵀ
    strength = as_tensor["beta"][..., None, None] if "beta" in as_tensor else 1.0
    if structure.conjugated:
        left, right = as_tensor["gamma"] * e, e / as_tensor["gamma"]
    if "erase_gate" in as_tensor:
        right = as_tensor["erase_gate"] * e
    erase_matrix = eye - strength * left[..., :, None] * right[..., None, :]
    if decay_matrix is None:
        return erase_matrix
    if name == "kda_f":
        basis = as_tensor["F"]
        decay_matrix = torch.linalg.solve(basis.mT, decay_matrix @ basis.mT)  # F⁻ᵀ Diag(α) Fᵀ
    return erase_matrix @ decay_matrix


def natural_metric(cell: str, *, gamma=None, F=None) -> Tensor | None:
    """M of the cell's natural norm ``‖M⁻¹ A M‖₂``: Diag(gamma) for a Γ-conjugated cell (GammaNet), F⁻ᵀ for kda_f,
    None (Euclidean) for the others."""
    name = stability_cell(cell)
    if structure_of(name).conjugated:
        if gamma is None:
            raise ValueError(f"natural_metric({name!r}): argument 'gamma' is required, got None")
        return torch.diag_embed(torch.as_tensor(gamma))
    if name == "kda_f":
        if F is None:
            raise ValueError("natural_metric('kda_f'): argument 'F' is required, got None")
        basis = torch.as_tensor(F)
        return torch.linalg.inv(basis).mT
    return None


def certificate_metric(cell: str, *, gamma=None, F=None) -> Tensor | None:
    """The M of the cell's certificate (``cell_certificate``): the natural metric or None (Euclidean; and for a
    spectral certificate, which bounds no norm)."""
    name = stability_cell(cell)
    return natural_metric(name, gamma=gamma, F=F) if cell_certificate(name).metric == "natural" else None


def _is_channel(alpha: Tensor, inputs: dict[str, Tensor]) -> bool:
    """A decay is per channel ([..., K]) when it has as many dimensions as the erase direction, or one more than beta,
    or when there is neither (GLA)."""
    if "erase" in inputs:
        return alpha.dim() == inputs["erase"].dim()
    if "beta" not in inputs:
        return True
    return alpha.dim() == inputs["beta"].dim() + 1


def _key_dim(name: str, structure: Structure, inputs: dict[str, Tensor]) -> int:
    for arg in ("erase", "gamma", "erase_gate"):
        if arg in inputs:
            if inputs[arg].dim() == 0:
                raise ValueError(f"transition({name!r}): argument {arg!r} must be [..., K], got a scalar")
            return inputs[arg].shape[-1]
    if structure.decay == "channel":
        if inputs["decay"].dim() == 0:
            raise ValueError(f"transition({name!r}): argument 'decay' must be per channel [..., K], got a scalar")
        return inputs["decay"].shape[-1]
    return 1  # α I: the spectrum and norms of [α] (module docstring)


def _check_values(name: str, structure: Structure, inputs: dict[str, Tensor], size: int) -> None:
    def fail(arg: str, expected: str, actual: str):
        raise ValueError(f"transition({name!r}): argument {arg!r} must be {expected}, got {actual}")

    for arg, x in inputs.items():
        if not torch.isfinite(x).all():
            fail(arg, "finite", "non-finite values")
    if "decay" in inputs:
        alpha = inputs["decay"]
        if structure.decay == "head" and "beta" in inputs and alpha.dim() > inputs["beta"].dim():
            fail("decay", f"one multiplier per step (shape of beta, {list(inputs['beta'].shape)})",
                 f"shape {list(alpha.shape)}")  # fmt: skip
        if structure.decay == "channel" and _is_channel(alpha, inputs) and alpha.shape[-1] != size:
            fail("decay", f"[..., K] with K = {size}", f"shape {list(alpha.shape)}")
        if (alpha < 0).any() or (alpha > 1).any():
            fail("decay", "the multiplier exp(g) in [0, 1]", f"values in [{alpha.min():.4g}, {alpha.max():.4g}]")
    if "beta" in inputs:
        beta = inputs["beta"]
        if (beta < 0).any() or (beta > 2).any():
            fail("beta", "in [0, 2]", f"values in [{beta.min():.4g}, {beta.max():.4g}]")
    if "erase_gate" in inputs:
        gate = inputs["erase_gate"]
        if gate.shape[-1] != size:
            fail("erase_gate", f"[..., K] with K = {size}", f"shape {list(gate.shape)}")
        if (gate < 0).any() or (gate > 2).any():
            fail("erase_gate", "in [0, 2]", f"values in [{gate.min():.4g}, {gate.max():.4g}]")
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
