"""How far linrnn's and FLA's Gated DeltaNet and KDA logits are from the definition, for the tolerances of
tests/models/test_fla_checkpoints.py: the tests' tiny models, the same weights in fp64 through linrnn's torch
recurrence as the reference. GPU machine, FLA and transformers importable::

    source experiments/device_env.sh && python3 experiments/fla_precision_probe.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fla import models  # noqa: E402

from linrnn.models.fla_checkpoints import from_fla, to_fla  # noqa: E402
from tests.models import test_fla_checkpoints as cases  # noqa: E402


def report(label: str, folder: str, linrnn_model, fla_model, length: int) -> None:
    ids = torch.randint(0, 97, (2, length), device="cuda")
    with torch.no_grad():
        reference = from_fla(folder, backend="torch").double().eval()(ids.cpu())
        linrnn_error = (linrnn_model(ids).double().cpu() - reference).abs().max()
        fla_error = (fla_model(input_ids=ids).logits.double().cpu() - reference).abs().max()
    print(f"{label}, T = {length}: max |reference| {reference.abs().max():.3e}, linrnn − reference "
          f"{linrnn_error:.3e}, FLA − reference {fla_error:.3e}")  # fmt: skip


for cell in ("gdn", "kda"):
    for tie in (False, True):
        fla = cases.fla_model(models, cell, tie)
        folder = tempfile.mkdtemp()
        fla.save_pretrained(folder, safe_serialization=True)
        for length in (40, 100):
            report(f"FLA {cell} model, tied {tie}", folder, from_fla(folder).cuda().eval(), fla, length)
    model = cases.linrnn_gdn(cell=cell, tie_embeddings=True, allow_neg_eigval=True).cuda().eval()
    folder = tempfile.mkdtemp()
    to_fla(model, folder)
    fla = getattr(models, cases.FLA_CLASSES[cell][1]).from_pretrained(folder).cuda().eval()
    for length in (40, 100):
        report(f"linrnn {cell} model, negative eigenvalues", folder, model, fla, length)
