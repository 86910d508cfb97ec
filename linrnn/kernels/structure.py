"""Which terms of the one recurrence a cell uses: the structure its op validates and dispatches on.

The full recurrence, per head (FLA orientation, ``S ∈ R^{K×V}``)::

    S_t = (I − β_t e_t (b_t ⊙ e_t)ᵀ) Diag(exp g_t) S_{t−1} + β_t k_t (w_t ⊙ v_t)ᵀ,   o_t = S_tᵀ (scale · q_t)

conjugated by ``Γ = Diag(exp log_gamma)`` (``e (b ⊙ e)ᵀ → Γ e eᵀ Γ⁻¹``) when ``conjugated``. A ``Structure`` says
which of these terms exist; each term that exists is one input of the cell's op (``input_names``):

- ``decay``: ``"none"`` (g = 0), ``"head"`` (g ``[B, T, H]``) or ``"channel"`` (g ``[B, T, H, K]``);
- ``erase``: ``"off"`` (no erase term), ``"tied"`` (e = k) or ``"decoupled"`` (e = a, its own input ``[B, T, H, K]``);
- ``write``: ``"one"`` (β = 1), ``"beta"`` (β ``[B, T, H]``, the strength of the write and of the erase; with the
  erase off it scales the write only, e.g. Mamba-2's step size Δ) or ``"channel"`` (w ``[B, T, H, V]`` per value
  channel, and β = 1);
- ``erase_gate``: ``"beta"`` (b = 1: the erase's strength is β alone) or ``"channel"`` (b ``[B, T, H, K]`` gates the
  erase per key channel on the side that reads the state: Gated DeltaNet-2);
- ``conjugated``: Γ (``log_gamma`` ``[H, K]``), GammaNet's Γ-conjugated erase.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DECAYS = ("none", "head", "channel")
ERASES = ("off", "tied", "decoupled")
ERASE_GATES = ("beta", "channel")
WRITES = ("one", "beta", "channel")

# every input an op may take besides q, k, v: symbolic shape, and what it is
INPUTS = {
    "a": ("[B, T, H, K]", "erase direction (unit rows)"),
    "g": (None, "log-decay"),  # shape by decay kind (``Structure.shape``)
    "beta": ("[B, T, H]", "write (and erase) strength"),
    "b": ("[B, T, H, K]", "erase gate per key channel"),
    "w": ("[B, T, H, V]", "write gate per value channel"),
    "log_gamma": ("[H, K]", "log of Γ's diagonal"),
}


@dataclass(frozen=True)
class Structure:
    """The terms of the recurrence a cell uses (module docstring)."""

    decay: Literal["none", "head", "channel"] = "none"
    erase: Literal["off", "tied", "decoupled"] = "off"
    erase_gate: Literal["beta", "channel"] = "beta"
    write: Literal["one", "beta", "channel"] = "beta"
    conjugated: bool = False

    def __post_init__(self):
        for name, allowed in (("decay", DECAYS), ("erase", ERASES), ("erase_gate", ERASE_GATES), ("write", WRITES)):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"Structure: argument {name!r} must be one of {list(allowed)}, got {value!r}")
        if not isinstance(self.conjugated, bool):
            raise ValueError(f"Structure: argument 'conjugated' must be a bool, got {self.conjugated!r}")
        if self.erase == "off" and self.erase_gate != "beta":
            raise ValueError(f"Structure: erase_gate={self.erase_gate!r} needs an erase, got erase='off'")
        if self.conjugated and self.erase == "off":
            raise ValueError("Structure: conjugated=True needs an erase (without one Γ cancels), got erase='off'")

    @property
    def has_beta(self) -> bool:
        return self.write == "beta"

    def input_names(self) -> tuple[str, ...]:
        """The op's inputs besides q, k, v, in order."""
        names = {
            "a": self.erase == "decoupled",
            "g": self.decay != "none",
            "beta": self.has_beta,
            "b": self.erase != "off" and self.erase_gate == "channel",
            "w": self.write == "channel",
            "log_gamma": self.conjugated,
        }
        return tuple(name for name, present in names.items() if present)

    def shape(self, name: str) -> str:
        """The symbolic shape of input ``name``."""
        if name == "g":
            return "[B, T, H]" if self.decay == "head" else "[B, T, H, K]"
        return INPUTS[name][0]

    def equation(self) -> str:
        """The state update, written with only the terms this structure has."""
        decay = {"none": "", "head": "exp(g_t) ", "channel": "Diag(exp g_t) "}[self.decay]
        beta = "β_t " if self.has_beta else ""
        value = "(w_t ⊙ v_t)ᵀ" if self.write == "channel" else "v_tᵀ"
        write = f"{beta}k_t {value}"
        if self.erase == "off":
            return f"S_t = {decay}S_{{t−1}} + {write}"
        e = "k_t" if self.erase == "tied" else "a_t"
        if self.conjugated:
            pair = f"Γ {e} {e}ᵀ Γ⁻¹"
        elif self.erase_gate == "channel":
            pair = f"{e} (b_t ⊙ {e})ᵀ"
        else:
            pair = f"{e} {e}ᵀ"
        return f"S_t = (I − {beta}{pair}) {decay}S_{{t−1}} + {write}"


@dataclass(frozen=True)
class Certificate:
    """The bound a structure's transitions satisfy: ``"euclidean"``, ``‖A_t‖₂ ≤ 1`` (so ρ ≤ 1 and products stay
    ≤ 1); ``"natural"``, ``‖Γ⁻¹ A_t Γ‖₂ ≤ 1`` (ρ ≤ 1, products ≤ cond(Γ)); ``"spectral"``, only ρ(A_t) ≤ 1 per
    step (no bound on norms or products)."""

    metric: Literal["euclidean", "natural", "spectral"]
    text: str


def certificate(structure: Structure) -> Certificate:
    """The certificate of a structure's homogeneous step ``S ↦ A_t S`` (``linrnn.stability.transition``)."""
    if structure.conjugated:
        return Certificate("natural", "ρ ≤ 1, ‖Γ⁻¹AΓ‖₂ ≤ 1, growth ≤ cond(Γ)")
    if structure.erase != "off" and structure.erase_gate == "channel":
        return Certificate("spectral", "ρ ≤ 1 per step; I − e (b⊙e)ᵀ is not symmetric, so ‖A‖₂ can exceed 1")
    return Certificate("euclidean", "‖A‖₂ ≤ 1")
