"""Argument checks shared by every op: each error names the argument, the expected and the actual value.

Structural checks (ranks, shapes, dtypes, devices, ``cu_seqlens``) always run.
Value checks that read tensor contents (and so cost a device sync) run only
with ``check_values=True``; the reference backend always runs them.
"""

from __future__ import annotations

import torch
from torch import Tensor

BACKENDS = ("auto", "triton", "torch", "reference")


def fail(op: str, message: str) -> None:
    raise ValueError(f"{op}: {message}")


def describe(x: object) -> str:
    """What an argument is, for an error message: ``torch.int64 tensor of shape [2, 5]``, or its type's name."""
    return f"{x.dtype} tensor of shape {list(x.shape)}" if isinstance(x, Tensor) else type(x).__name__


def check_tensor(op: str, name: str, x: object, expected: list[int | str], names: str) -> None:
    """``expected`` holds ints (sizes that must match) and letters (free sizes); ``names`` is the
    symbolic shape, e.g. ``"[B, T, H, K]"``. Every op call runs this on each input: the messages are formed only
    on failure."""
    if not isinstance(x, Tensor):
        fail(op, f"argument '{name}' must be a torch.Tensor of shape {names} = {_sizes(expected)}, got "
                 f"{type(x).__name__}")  # fmt: skip
    if not x.is_floating_point():
        fail(op, f"argument '{name}' must be a floating-point tensor, got dtype {x.dtype}")
    shape = x.shape
    if len(shape) != len(expected) or any(isinstance(w, int) and s != w for s, w in zip(shape, expected, strict=True)):
        fail(op, f"argument '{name}' must have shape {names} = {_sizes(expected)}, got shape {list(shape)}")


def _sizes(expected: list[int | str]) -> str:
    return "[" + ", ".join(str(size) for size in expected) + "]"


def check_same(op: str, tensors: dict[str, Tensor | None], attr: str) -> None:
    """All given tensors share ``attr`` ('dtype' or 'device')."""
    present = {name: getattr(x, attr) for name, x in tensors.items() if x is not None}
    first_name, first = next(iter(present.items()))
    for name, value in present.items():
        if value != first:
            fail(op, f"argument '{name}' must have {attr} {first} (as '{first_name}'), got {value}")


def check_cu_seqlens(op: str, cu_seqlens: Tensor, batch: int, steps: int, device: torch.device) -> int:
    """Returns the number of sequences; ``cu_seqlens`` may be on the CPU or on ``device`` (q's)."""
    if not isinstance(cu_seqlens, Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.is_floating_point():
        fail(op, f"argument 'cu_seqlens' must be a 1-D integer tensor [N + 1], got {describe(cu_seqlens)}")
    if cu_seqlens.device not in (torch.device("cpu"), device):
        fail(op, f"argument 'cu_seqlens' must be on the CPU or on q's device {device}, got {cu_seqlens.device}")
    if batch != 1:
        fail(op, f"argument 'cu_seqlens' requires batch size B = 1 (sequences packed along T), got B = {batch}")
    if torch.compiler.is_compiling():  # the values are data: reading them would break the graph (the op reads them)
        return cu_seqlens.shape[0] - 1
    bounds = cu_seqlens.tolist()
    if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != steps:
        fail(op, f"argument 'cu_seqlens' must start at 0 and end at T = {steps} with at least 2 entries, got {bounds}")
    if any(b < a for a, b in zip(bounds[:-1], bounds[1:], strict=True)):
        fail(op, f"argument 'cu_seqlens' must be non-decreasing, got {bounds}")
    return len(bounds) - 1


def check_range(op: str, name: str, x: Tensor, low: float | None = None, high: float | None = None,
                what: str = "") -> None:  # fmt: skip
    """Content check: ``x`` finite and within [low, high] (a bound of None is open); ``what`` describes it."""
    label = f"argument {name!r}" + (f" ({what})" if what else "")
    if not torch.isfinite(x).all():
        fail(op, f"{label} must be finite, got non-finite values")
    below, above = low is not None and (x < low).any(), high is not None and (x > high).any()
    if (below or above) and low is not None and high is not None:
        fail(op, f"{label} must lie in [{low:g}, {high:g}], got range [{x.min().item():.4g}, {x.max().item():.4g}]")
    if below:
        fail(op, f"{label} must be >= {low:g}, got min {x.min().item():.4g}")
    if above:
        fail(op, f"{label} must be <= {high:g}, got max {x.max().item():.4g}")


def check_unit_rows(op: str, name: str, x: Tensor) -> None:
    tol = 1e-2  # catches un-normalised input; rounding a unit row to bf16 moves its norm by up to ~4e-3
    norms = x.float().norm(dim=-1)
    worst = (norms - 1).abs().max().item()
    if worst > tol:
        fail(
            op, f"argument '{name}' must have unit-norm rows (L2 over the last axis), got max |norm - 1| = {worst:.3g}"
        )


def check_options(op: str, backend: str, chunk_size: int | None) -> None:
    if backend not in BACKENDS:
        fail(op, f"argument 'backend' must be one of {list(BACKENDS)}, got {backend!r}")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        fail(op, f"argument 'chunk_size' must be a positive int, got {chunk_size!r}")


__all__ = [
    "BACKENDS",
    "check_cu_seqlens",
    "check_options",
    "check_same",
    "check_tensor",
    "check_unit_rows",
    "check_range",
    "fail",
]
