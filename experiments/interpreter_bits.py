"""Outputs and every gradient of the five chunk cells under the Triton interpreter (fp16 inputs: the interpreter's
bf16 products are wrong), saved for a bit-for-bit comparison of two source trees::

    mkdir /tmp/main_tree && git archive main linrnn tests | tar x -C /tmp/main_tree
    .venv-triton-3.6.0/bin/python experiments/interpreter_bits.py /tmp/main_tree /tmp/main.pt
    .venv-triton-3.6.0/bin/python experiments/interpreter_bits.py . /tmp/this.pt --compare /tmp/main.pt
"""

import argparse
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", help="the source tree to import linrnn and tests from")
    parser.add_argument("out", help="where to save the results (torch.save)")
    parser.add_argument("--compare", help="an earlier run's file: report which tensors differ")
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.tree))
    import torch

    from tests.helpers import OPS, make_inputs

    results = {}
    for cell in ["gla", "deltanet", "gated_deltanet", "kda", "gammanet"]:
        x = make_inputs(cell, B=2, T=130, H=2, K=32, V=48, initial_state=True, dtype=torch.float16, seed=3)
        leaves = {n: (t.float() if t.dtype == torch.float64 else t).requires_grad_(True) for n, t in x.items()}
        o, final = OPS[cell](**leaves, output_final_state=True, backend="triton")
        gen = torch.Generator().manual_seed(0)
        loss = (o.float() * torch.randn(o.shape, generator=gen)).sum()
        (loss + (final * torch.randn(final.shape, generator=gen)).sum()).backward()
        results[cell] = {"o": o.detach(), "final": final.detach(), **{f"d{n}": t.grad for n, t in leaves.items()}}
    torch.save(results, args.out)
    if args.compare:
        # the file this script wrote itself: plain tensors in dicts
        before = torch.load(args.compare, weights_only=True)
        for cell, tensors in results.items():
            differ = [name for name, t in tensors.items() if not torch.equal(t, before[cell][name])]
            print(f"{cell}: {'equal bit for bit' if not differ else 'differ: ' + ', '.join(differ)}")


if __name__ == "__main__":
    main()
