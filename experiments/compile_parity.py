"""Where the compiled bf16 model departs from the eager one: per-parameter gradient relative errors of
inductor-compiled bf16 vs eager bf16, and of each against eager fp32 (no autocast), for the cells given.

    python experiments/compile_parity.py gammanet kda            # CUDA: the Triton kernels
    python experiments/compile_parity.py --cpu gammanet kda      # CPU: the torch chunkwise path, CPU autocast

On the CPU (c02cbe7+, 2026-11-25): logits compiled/eager 1.5e-2 and eager/fp32 1.8e-2 for both cells; the largest
gradient differences compiled/eager 2.9e-2 (GammaNet ``log_gamma``) and 4.5e-2 (KDA ``A_log``), with eager/fp32
3.1e-2 and 6.2e-2 for the same gradients: rounding noise of the same size in both, not a different computation.

The same model, batch and loss as tests/models/test_compile.py::test_inductor_bf16_on_gpu_equals_eager. If
compiled-vs-eager is far above eager-vs-fp32, the compiled graph computes something else; if both are of the
size of bf16 rounding of that gradient, the difference is rounding in different places.
"""

from __future__ import annotations

import copy
import sys

import torch
import torch.nn.functional as F

import linrnn


def relative_error(actual, expected) -> float:
    return float(
        torch.linalg.norm(actual.float() - expected.float()) / torch.linalg.norm(expected.float()).clamp_min(1e-30)
    )


def grads(model, ids, targets, autocast: bool):
    model.zero_grad()
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        logits = model(ids)
        F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()).backward()
    parameters = getattr(model, "_orig_mod", model).named_parameters()
    return logits.detach(), {name: p.grad.clone() for name, p in parameters}


def main(cells: list[str], device: str) -> None:
    for cell in cells:
        torch._dynamo.reset()
        torch.manual_seed(0)
        backend = "torch" if device == "cpu" else "auto"
        model = linrnn.build_model(cell, num_layers=2, hidden_size=256, num_heads=2, vocab_size=512, backend=backend)
        model = model.to(device)
        compiled = torch.compile(copy.deepcopy(model), fullgraph=True)
        gen = torch.Generator(device=device).manual_seed(7)
        ids, targets = (torch.randint(0, 512, (2, 300), device=device, generator=gen) for _ in range(2))
        (c_logits, c_grads), (e_logits, e_grads) = (grads(m, ids, targets, True) for m in (compiled, model))
        f_logits, f_grads = grads(model, ids, targets, False)
        print(
            f"{cell}: logits compiled/eager {relative_error(c_logits, e_logits):.2e}, "
            f"eager/fp32 {relative_error(e_logits, f_logits):.2e}, "
            f"compiled/fp32 {relative_error(c_logits, f_logits):.2e}"
        )
        rows = sorted(e_grads, key=lambda n: -relative_error(c_grads[n], e_grads[n]))
        for name in rows[:8]:
            print(
                f"  {name:40s} compiled/eager {relative_error(c_grads[name], e_grads[name]):.2e}  "
                f"eager/fp32 {relative_error(e_grads[name], f_grads[name]):.2e}  "
                f"compiled/fp32 {relative_error(c_grads[name], f_grads[name]):.2e}"
            )


if __name__ == "__main__":
    arguments = sys.argv[1:]
    on_cpu = "--cpu" in arguments
    main([a for a in arguments if a != "--cpu"] or ["gammanet"], "cpu" if on_cpu else "cuda")
