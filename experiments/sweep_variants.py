"""The SGD follow-ups of docs/sweeps.md: GDN-muP with one SGD rule changed, to find which rule makes the wide
models learn less under SGD. Registers the variants below, then runs ``linrnn sweep`` with the arguments given:

    python experiments/sweep_variants.py --cells gdn --optimizers sgd --params gdn-mup-emb-1 gdn-mup-norm-1 \\
        --widths 128 1024 --table docs/results/sweeps/gdn_sgd_variants.jsonl

| variant | change from GDN-muP (SGD only) |
|---|---|
| gdn-mup-emb-sqrt / gdn-mup-emb-1 | embedding lr multiplier √m_out / 1 (muP: m_out) |
| gdn-mup-norm-1 | norm gains' lr multiplier 1 (muP: m_out) |
| gdn-mup-conv-1 | short convs' lr multiplier 1 (muP: m_out, as input-like matrices) |
| gdn-mup-hidden-init-sp | hidden matrices initialised at σ, as SP (muP: σ / √m_in) |
| gdn-mup-readout-sp | readout as SP's: logit multiplier 1, lr multiplier 1 (muP: 1/m and m_in) |
| gdn-mup-no-prenorm | without seed 000 §4.3's multiplier on the recurrence output |
"""

import sys

from linrnn import parametrizations
from linrnn.parametrizations.base import Optimizer, Rule, Shape
from linrnn.parametrizations.gdn_mup import GdnMuP


class SgdVariant(GdnMuP):
    """GDN-muP with, under SGD, the lr multiplier and init scale of matching parameters replaced."""

    def __init__(self, name, matches, lr=None, init_scale=None, readout_sp=False, pre_norm_multiplier=True):
        self.name, self.description = name, f"GDN-muP variant {name} (experiments/sweep_variants.py)"
        self.matches, self.new_lr, self.new_init_scale = matches, lr, init_scale
        self.readout_sp, self.pre_norm_multiplier = readout_sp, pre_norm_multiplier

    def rule(self, role: str, shape: Shape, m: float, optimizer: Optimizer) -> Rule:
        rule = super().rule(role, shape, m, optimizer)
        if optimizer != "sgd" or not self.matches(role, shape):
            return rule
        lr = rule.lr if self.new_lr is None else self.new_lr(shape)
        init_scale = rule.init_scale if self.new_init_scale is None else self.new_init_scale
        return Rule(init_scale=init_scale, lr=lr)

    def logit_multiplier(self, m: float) -> float:
        return 1.0 if self.readout_sp else super().logit_multiplier(m)


def is_conv(role, shape):
    return role == "hidden" and shape.matrix and not shape.grows_in


def is_hidden(role, shape):
    return role == "hidden" and shape.matrix and shape.grows_in


VARIANTS = [
    SgdVariant("gdn-mup-emb-sqrt", lambda role, shape: role == "embedding", lr=lambda shape: shape.m_out**0.5),
    SgdVariant("gdn-mup-emb-1", lambda role, shape: role == "embedding", lr=lambda shape: 1.0),
    SgdVariant("gdn-mup-norm-1", lambda role, shape: role == "norm", lr=lambda shape: 1.0),
    SgdVariant("gdn-mup-conv-1", is_conv, lr=lambda shape: 1.0),
    SgdVariant("gdn-mup-hidden-init-sp", is_hidden, init_scale=1.0),
    SgdVariant("gdn-mup-readout-sp", lambda role, shape: role == "readout", lr=lambda shape: 1.0, readout_sp=True),
    SgdVariant("gdn-mup-no-prenorm", lambda role, shape: False, pre_norm_multiplier=False),
]
# at import, so the sweep's spawned workers (which import this file) know the variants too
for variant in VARIANTS:
    parametrizations.register(variant)

if __name__ == "__main__":
    from linrnn.cli import main

    sys.exit(main(["sweep", *sys.argv[1:]]))
