"""The SGD follow-up of docs/sweeps.md: GDN-muP with the embedding's SGD learning-rate multiplier lowered from
muP's m_out to √m_out ("gdn-mup-emb-sqrt") or 1 ("gdn-mup-emb-1"), everything else as GDN-muP. Registers the two
variants, then runs ``linrnn sweep`` with the arguments given, e.g.

    python scripts/sweep_embedding_lr.py --cells gdn --optimizers sgd --params gdn-mup-emb-sqrt gdn-mup-emb-1 \\
        --table docs/results/sweeps/gdn.jsonl --out docs/results/sweeps
"""

import sys

from linrnn import parametrizations
from linrnn.parametrizations.base import Optimizer, Rule, Shape
from linrnn.parametrizations.gdn_mup import GdnMuP


class EmbeddingLrVariant(GdnMuP):
    """GDN-muP with the embedding's SGD lr multiplier m_out ** power (muP: power 1)."""

    def __init__(self, name: str, power: float):
        self.name, self.power = name, power
        self.description = f"GDN-muP with the embedding's SGD lr at m_out^{power}"

    def rule(self, role: str, shape: Shape, m: float, optimizer: Optimizer) -> Rule:
        rule = super().rule(role, shape, m, optimizer)
        if optimizer == "sgd" and role == "embedding":
            return Rule(init_scale=rule.init_scale, lr=shape.m_out**self.power)
        return rule


# at import, so the sweep's spawned workers (which import this file) know the variants too
parametrizations.register(EmbeddingLrVariant("gdn-mup-emb-sqrt", 0.5))
parametrizations.register(EmbeddingLrVariant("gdn-mup-emb-1", 0.0))

if __name__ == "__main__":
    from linrnn.cli import main

    sys.exit(main(["sweep", *sys.argv[1:]]))
