"""``check(cell)``: the worst transition found by random draws and by an adversarial search, against the cell's
certificate.

Random draws (``random_inputs``), ``draws`` steps in sequences of ``horizon`` steps:

- decay α per head or per channel: ``exp(−10^u)``, u ~ U(−4, 2), so α covers (0, 1) from e^−100 to 1 − 1e−4;
  each entry is then set to exactly 1 with probability 0.1 and to exactly 0 with probability 0.05;
- beta ~ U(0, beta_max), exactly 0, 1 or beta_max with probability 0.05 each (beta_max = 2: negative
  eigenvalues allowed, the widest range any cell admits); a per-channel erase gate b (Gated DeltaNet-2) per channel
  likewise;
- erase directions uniform on the unit sphere;
- GammaNet: one Γ per sequence with cond(Γ) log-uniform in [1, gamma_cond] (its extreme channels at
  ``±log(cond)/2`` in log Γ, the rest uniform between);
- kda_f: the given F, or one per sequence: ``F="general"``, Gaussian entries; ``F="orthogonal"``, QΓ with Q Haar
  and Γ as above.

Adversarial search: gradient ascent (Adam, lr 0.05) over unconstrained parameters mapped onto the
admissible set (α = sigmoid, β and b = beta_max · sigmoid, e = normalize, log Γ = log(gamma_cond)/2 · tanh, F free or
F = expm(W − Wᵀ) Diag(exp s)), ``restarts`` random starts × ``steps`` steps, each start climbing one of three
objectives: the spectral radius of its first step (through ``log ‖A^64‖₂ / 64``, whose gradient is smooth), the
first step's norm in the certificate's metric, and the growth of its ``horizon``-step sequence relative to the
certificate's bound. Every start's inputs are measured exactly (eigenvalues, SVD) every 25 steps and at the end.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F_
from torch import Tensor

from linrnn.stability.measures import (
    condition_number,
    log_growth,
    log_spectral_radius_surrogate,
    lyapunov_exponents,
    natural_norm,
    operator_norm,
    spectral_radius,
)
from linrnn.stability.transition import (
    cell_certificate,
    certificate_metric,
    decay_kind,
    natural_metric,
    needed_inputs,
    stability_cell,
    transition,
)

TOLERANCE = 1e-9  # fp64 slack on every bound (‖A‖₂ = 1 exactly at α = 1, β = 0 comes out as 1 ± 1e-15)


def within_certificate(spectral_radius: float, certificate_norm: float, growth_ratio: float,
                       metric: str = "euclidean") -> bool:  # fmt: skip
    """The certificate's verdict, each bound up to TOLERANCE: ρ ≤ 1, and unless the certificate is ``"spectral"``
    (ρ only) the norm in its metric ≤ 1 and growth ≤ its bound."""
    if metric == "spectral":
        return spectral_radius <= 1 + TOLERANCE
    return max(spectral_radius, certificate_norm, growth_ratio) <= 1 + TOLERANCE


@dataclass
class Measured:
    """Exact measures of a batch of sequences ``[N, T]`` of transitions and the inputs that made them."""

    inputs: dict[str, Tensor]  # each [N, T, ...] (gamma, F: [N, 1, ...])
    spectral_radius: Tensor  # [N, T]
    norm: Tensor  # [N, T], ‖A‖₂
    natural_norm: Tensor  # [N, T], in the cell's natural metric
    certificate_norm: Tensor  # [N, T], in the certificate's metric
    log_growth: Tensor  # [N, T], log ‖A_t ⋯ A_1‖₂
    log_bound: Tensor  # [N], log cond(M) of the certificate's metric: the growth bound
    lyapunov: Tensor  # [N], top Lyapunov exponent estimate


@dataclass
class StabilityReport:
    """What ``check`` found: the largest of each measure over every draw and search step, and the inputs."""

    cell: str
    key_dim: int
    horizon: int
    bound: str
    max_spectral_radius: float
    max_norm: float
    max_natural_norm: float
    max_certificate_norm: float
    max_growth: float  # ‖A_t ⋯ A_1‖₂ over t ≤ horizon
    max_growth_ratio: float  # growth / its bound (cond of the certificate's metric)
    max_lyapunov: float
    draws: int
    search: str
    # measure → its worst inputs: one step for spectral_radius, norm, natural_norm, certificate_norm; a whole
    # sequence [T, ...] for log_growth, log_growth_ratio, final_log_growth (at T = horizon), lyapunov
    worst: dict[str, dict[str, Tensor]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return within_certificate(self.max_spectral_radius, self.max_certificate_norm, self.max_growth_ratio,
                                  cell_certificate(self.cell).metric)  # fmt: skip

    @property
    def verdict(self) -> str:
        if self.passed:
            return "stable: certificate holds"
        if self.max_spectral_radius > 1 + TOLERANCE:
            return "UNSTABLE: spectral radius > 1"
        return "certificate violated"

    def summary(self) -> dict[str, object]:
        return {
            "cell": self.cell,
            "max_spectral_radius": self.max_spectral_radius,
            "max_norm": self.max_norm,
            "max_natural_norm": self.max_natural_norm,
            "max_growth": self.max_growth,
            "max_growth_ratio": self.max_growth_ratio,
            "max_lyapunov": self.max_lyapunov,
            "bound": self.bound,
            "passed": self.passed,
            "verdict": self.verdict,
        }


def measure(cell: str, inputs: dict[str, Tensor], generator: torch.Generator | None = None) -> Measured:
    """Exact measures of sequences of inputs ``[N, T, ...]`` (``transition``'s arguments)."""
    name = stability_cell(cell)
    A = transition(name, **inputs)  # [N, T, K, K]
    shared = {arg: inputs[arg][:, 0] for arg in ("gamma", "F") if arg in inputs}  # fixed along a sequence
    natural = natural_metric(name, **shared) if shared else None
    euclidean = operator_norm(A)
    in_natural = euclidean if natural is None else natural_norm(A, natural[:, None])  # [N, 1, K, K] per step
    certified_natural = cell_certificate(name).metric == "natural"
    return Measured(
        inputs=inputs,
        spectral_radius=spectral_radius(A),
        norm=euclidean,
        natural_norm=in_natural,
        certificate_norm=in_natural if certified_natural else euclidean,
        log_growth=log_growth(A),
        log_bound=condition_number(natural if certified_natural else None, A[:, 0]).log(),
        lyapunov=lyapunov_exponents(A, generator)[..., 0],
    )


def random_inputs(cell: str, sequences: int, horizon: int, key_dim: int, *, beta_max: float = 2.0,
                  gamma_cond: float = 1e3, F: Tensor | str = "general",
                  generator: torch.Generator | None = None) -> dict[str, Tensor]:  # fmt: skip
    """Admissible inputs ``[sequences, horizon, ...]`` drawn as in the module docstring (fp64, CPU)."""
    name = stability_cell(cell)
    needs, shape = needed_inputs(name), (sequences, horizon)
    options = dict(dtype=torch.float64, generator=generator)
    inputs = {}
    if "decay" in needs:
        decay_shape = shape + ((key_dim,) if decay_kind(name) == "channel" else ())
        alpha = torch.exp(-(10 ** torch.empty(decay_shape, dtype=torch.float64).uniform_(-4, 2, generator=generator)))
        pick = torch.rand(decay_shape, **options)
        inputs["decay"] = torch.where(pick < 0.1, 1.0, torch.where(pick < 0.15, 0.0, alpha))
    if "beta" in needs:
        inputs["beta"] = _random_strength(shape, beta_max, options)
    if "erase_gate" in needs:  # per channel, drawn as beta
        inputs["erase_gate"] = _random_strength(shape + (key_dim,), beta_max, options)
    if "erase" in needs:
        inputs["erase"] = F_.normalize(torch.randn(shape + (key_dim,), **options), dim=-1)
    if "gamma" in needs:
        inputs["gamma"] = _random_gamma(sequences, key_dim, gamma_cond, generator)[:, None]
    if "F" in needs:
        inputs["F"] = _basis(F, sequences, key_dim, gamma_cond, generator)[:, None]
    return inputs


def _random_strength(shape: tuple[int, ...], beta_max: float, options: dict) -> Tensor:
    """U(0, beta_max), exactly 0, 1 or beta_max with probability 0.05 each."""
    strength = torch.rand(shape, **options) * beta_max
    pick = torch.rand(shape, **options)
    edges = torch.where(pick < 0.05, 0.0, torch.where(pick < 0.1, 1.0, beta_max))
    return torch.where(pick < 0.15, edges.clamp(max=beta_max), strength)


def _random_gamma(count: int, size: int, max_cond: float, generator) -> Tensor:
    """``[count, size]`` positive diagonals, cond log-uniform in [1, max_cond], extremes attained."""
    log_cond = torch.rand(count, 1, dtype=torch.float64, generator=generator) * math.log(max_cond)
    spread = torch.rand(count, size, dtype=torch.float64, generator=generator) - 0.5
    if size > 1:
        spread[:, 0], spread[:, 1] = -0.5, 0.5
    return torch.exp(log_cond * spread)


def _basis(F: Tensor | str, count: int, size: int, gamma_cond: float, generator) -> Tensor:
    """kda_f's basis ``[count, size, size]``: a given F, or random ``"general"`` / ``"orthogonal"`` (QΓ) ones."""
    if isinstance(F, Tensor):
        if F.shape != (size, size):
            raise ValueError(f"check('kda_f'): argument 'F' must be [{size}, {size}], got shape {list(F.shape)}")
        return F.to(torch.float64).expand(count, size, size)
    gaussian = torch.randn(count, size, size, dtype=torch.float64, generator=generator)
    if F == "general":
        return gaussian
    if F == "orthogonal":
        return torch.linalg.qr(gaussian).Q * _random_gamma(count, size, gamma_cond, generator)[:, None, :]
    raise ValueError(f"check('kda_f'): argument 'F' must be a tensor, 'general' or 'orthogonal', got {F!r}")


class _SearchSpace(torch.nn.Module):
    """Unconstrained parameters of ``restarts`` sequences and their map onto admissible inputs."""

    def __init__(self, cell: str, restarts: int, horizon: int, key_dim: int, beta_max: float, gamma_cond: float,
                 F: Tensor | str, generator: torch.Generator):  # fmt: skip
        super().__init__()
        self.cell, self.beta_max, self.log_cond = cell, beta_max, math.log(gamma_cond)
        needs, shape = needed_inputs(cell), (restarts, horizon)

        def param(*dims, scale=1.0, shift=0.0):
            return torch.nn.Parameter(torch.randn(dims, dtype=torch.float64, generator=generator) * scale + shift)

        self.params = torch.nn.ParameterDict()
        if "decay" in needs:
            self.params["decay"] = param(*shape, *((key_dim,) if decay_kind(cell) == "channel" else ()), scale=2,
                                         shift=2)  # fmt: skip
        if "beta" in needs:
            self.params["beta"] = param(*shape, scale=2)
        if "erase_gate" in needs:
            self.params["erase_gate"] = param(*shape, key_dim, scale=2)
        if "erase" in needs:
            self.params["erase"] = param(*shape, key_dim)
        if "gamma" in needs:
            self.params["gamma"] = param(restarts, 1, key_dim)
        self.fixed_basis = None
        if "F" in needs:
            if isinstance(F, Tensor):
                self.fixed_basis = _basis(F, restarts, key_dim, gamma_cond, generator)[:, None]
            elif F in ("general", "orthogonal"):
                self.params["F"] = param(restarts, 1, key_dim, key_dim)
                if F == "orthogonal":
                    self.params["F_scale"] = param(restarts, 1, key_dim)
            else:
                _basis(F, 1, key_dim, gamma_cond, generator)  # raises the error for a bad F

    def forward(self) -> dict[str, Tensor]:
        p, inputs = self.params, {}
        if "decay" in p:
            inputs["decay"] = torch.sigmoid(p["decay"])
        if "beta" in p:
            inputs["beta"] = self.beta_max * torch.sigmoid(p["beta"])
        if "erase_gate" in p:
            inputs["erase_gate"] = self.beta_max * torch.sigmoid(p["erase_gate"])
        if "erase" in p:
            inputs["erase"] = F_.normalize(p["erase"], dim=-1)
        if "gamma" in p:
            inputs["gamma"] = torch.exp(self.log_cond / 2 * torch.tanh(p["gamma"]))
        if self.fixed_basis is not None:
            inputs["F"] = self.fixed_basis
        elif "F_scale" in p:
            skew = p["F"] - p["F"].mT
            scale = torch.exp(self.log_cond / 2 * torch.tanh(p["F_scale"]))
            inputs["F"] = torch.linalg.matrix_exp(skew) * scale[..., None, :]
        elif "F" in p:
            inputs["F"] = p["F"]
        return inputs


def adversarial_inputs(cell: str, *, restarts: int, steps: int, horizon: int, key_dim: int, beta_max: float = 2.0,
                       gamma_cond: float = 1e3, F: Tensor | str = "general", generator: torch.Generator | None = None,
                       on_step: Callable[[], None] | None = None) -> list[dict[str, Tensor]]:  # fmt: skip
    """The gradient-ascent search of the module docstring; returns the inputs of every start at every
    evaluation (each ``[restarts, horizon, ...]``), to be measured exactly."""
    name = stability_cell(cell)
    generator = generator or torch.Generator().manual_seed(0)
    space = _SearchSpace(name, restarts, horizon, key_dim, beta_max, gamma_cond, F, generator)
    optimizer = torch.optim.Adam(space.parameters(), lr=0.05)
    objective = torch.arange(restarts) % 3  # 0: spectral radius, 1: certificate norm, 2: growth ratio
    snapshots = []
    for step in range(steps + 1):
        inputs = space()
        if step % 25 == 0 or step == steps:
            snapshots.append({arg: x.detach().clone() for arg, x in inputs.items()})
        if step == steps:
            break
        A = transition(name, **inputs)  # [R, T, K, K]
        metric = certificate_metric(name, **{arg: inputs[arg][:, 0] for arg in ("gamma", "F") if arg in inputs})
        first = A[:, 0]
        radius = log_spectral_radius_surrogate(first)
        norm = natural_norm(first, metric).clamp_min(1e-300).log()
        ratio = log_growth(A)[:, -1] - condition_number(metric, first).log()
        score = torch.where(objective == 0, radius, torch.where(objective == 1, norm, ratio))
        optimizer.zero_grad()
        (-score[torch.isfinite(score)].sum()).backward()
        optimizer.step()
        if on_step is not None:
            on_step()
    return snapshots


def check(cell: str, *, key_dim: int = 8, draws: int = 10_000, horizon: int = 32, restarts: int = 48,
          steps: int = 200, beta_max: float = 2.0, gamma_cond: float = 1e3, F: Tensor | str = "general",
          seed: int = 0, on_step: Callable[[], None] | None = None) -> StabilityReport:  # fmt: skip
    """Random draws (``draws`` steps in sequences of ``horizon``) and the adversarial search (``restarts`` ×
    ``steps``), measured exactly; the report has the maxima, the worst inputs and the verdict. ``F`` (kda_f
    only): a fixed basis ``[K, K]``, or ``"general"`` / ``"orthogonal"`` to draw and search over bases.
    ``on_step`` is called once per random batch and per search step (for a progress bar)."""
    name = stability_cell(cell)
    for arg, value, low in (("key_dim", key_dim, 1), ("draws", draws, 0), ("horizon", horizon, 1),
                            ("restarts", restarts, 0), ("steps", steps, 0)):  # fmt: skip
        if not isinstance(value, int) or value < low:
            raise ValueError(f"check({name!r}): argument {arg!r} must be an integer ≥ {low}, got {value!r}")
    if not 0 <= beta_max <= 2:
        raise ValueError(f"check({name!r}): argument 'beta_max' must be in [0, 2], got {beta_max}")
    if gamma_cond < 1:
        raise ValueError(f"check({name!r}): argument 'gamma_cond' must be ≥ 1, got {gamma_cond}")
    if draws == 0 and not (restarts and steps):
        raise ValueError(f"check({name!r}): nothing to measure: draws = 0 and no search (restarts × steps = 0)")
    generator = torch.Generator().manual_seed(seed)
    found = _Worst(name)
    sequences = -(-draws // horizon)
    for start in range(0, sequences, 256):
        batch = random_inputs(name, min(256, sequences - start), horizon, key_dim, beta_max=beta_max,
                              gamma_cond=gamma_cond, F=F, generator=generator)  # fmt: skip
        found.update(measure(name, batch, generator))
        if on_step is not None:
            on_step()
    if restarts and steps:
        for snapshot in adversarial_inputs(name, restarts=restarts, steps=steps, horizon=horizon, key_dim=key_dim,
                                           beta_max=beta_max, gamma_cond=gamma_cond, F=F, generator=generator,
                                           on_step=on_step):  # fmt: skip
            found.update(measure(name, snapshot, generator))
    search = f"{restarts} starts × {steps} Adam steps, horizon {horizon}" if restarts and steps else "none"
    return found.report(key_dim, horizon, sequences * horizon, search)


class _Worst:
    """Running maxima over batches of ``Measured`` and the inputs behind each."""

    def __init__(self, cell: str):
        self.cell = cell
        self.best: dict[str, tuple[float, dict[str, Tensor]]] = {}

    def update(self, m: Measured) -> None:
        step_measures = {"spectral_radius": m.spectral_radius, "norm": m.norm, "natural_norm": m.natural_norm,
                         "certificate_norm": m.certificate_norm}  # fmt: skip
        for key, values in step_measures.items():  # [N, T]: one step's inputs
            values = torch.nan_to_num(values, nan=math.inf)
            flat = int(values.argmax())
            row, col = divmod(flat, values.shape[1])
            self._offer(key, float(values[row, col]), {arg: x[row, min(col, x.shape[1] - 1)] for arg, x in
                                                       m.inputs.items()})  # fmt: skip
        growth = torch.nan_to_num(m.log_growth.amax(-1), nan=math.inf)  # [N]: whole sequences
        ratio = torch.nan_to_num(m.log_growth.amax(-1) - m.log_bound, nan=math.inf)
        final = torch.nan_to_num(m.log_growth[:, -1], nan=math.inf)
        for key, values in (("log_growth", growth), ("log_growth_ratio", ratio), ("final_log_growth", final),
                            ("lyapunov", m.lyapunov)):  # fmt: skip
            row = int(values.argmax())
            self._offer(key, float(values[row]), {arg: x[row] for arg, x in m.inputs.items()})

    def _offer(self, key: str, value: float, inputs: dict[str, Tensor]) -> None:
        if key not in self.best or value > self.best[key][0]:
            self.best[key] = (value, inputs)

    def report(self, key_dim: int, horizon: int, draws: int, search: str) -> StabilityReport:
        value = {key: best[0] for key, best in self.best.items()}
        return StabilityReport(
            cell=self.cell,
            key_dim=key_dim,
            horizon=horizon,
            bound=cell_certificate(self.cell).text,
            max_spectral_radius=value["spectral_radius"],
            max_norm=value["norm"],
            max_natural_norm=value["natural_norm"],
            max_certificate_norm=value["certificate_norm"],
            max_growth=math.exp(min(value["log_growth"], 700)),
            max_growth_ratio=math.exp(min(value["log_growth_ratio"], 700)),
            max_lyapunov=value["lyapunov"],
            draws=draws,
            search=search,
            worst={key: best[1] for key, best in self.best.items()},
        )
