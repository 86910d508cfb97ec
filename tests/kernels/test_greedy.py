"""The greedy step's end in one kernel (``triton/greedy.py``) against ``torch.argmax`` and the engine's own
bookkeeping: odd vocabulary sizes (one block, several, a partial last one), ties inside a block and across blocks
(the first maximum wins), bf16 and fp32 logits read from a wider row, several slots. Compiled on CUDA, under
``TRITON_INTERPRET=1`` on a CPU-only machine."""

import importlib.util
import os

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # read when triton is imported: set it first

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("vocab, block", [(37, None), (1000, 256), (8193, None)])
def test_greedy_step_is_argmax_and_bookkeeping(monkeypatch, dtype, vocab, block):
    from linrnn.kernels.triton import greedy

    if block is not None:
        monkeypatch.setattr(greedy, "BLOCK", block)  # several blocks, the last one partly filled
    torch.manual_seed(vocab)
    slots = 5
    wide = torch.randn(slots, vocab + 3, dtype=torch.float64)  # the rows 3 columns apart: a slice of a wider matrix
    top = wide[:, :vocab].max()
    wide[1, [7, 3]] = top + 1  # a tie inside the first block
    wide[2, [vocab - 1, 5]] = top + 1  # a tie across blocks: the earlier one wins
    logits = wide.to(dtype).to(DEVICE)[:, :vocab]
    next_tokens = torch.full((slots,), -1, dtype=torch.long, device=DEVICE)
    tokens = torch.full((slots, 1), -1, dtype=torch.long, device=DEVICE)
    positions = torch.arange(slots, device=DEVICE) * 10
    counters = torch.arange(slots, device=DEVICE)
    greedy.greedy_step(logits, next_tokens, tokens[:, 0], positions, counters)
    expected = logits.float().argmax(dim=-1)
    assert next_tokens.tolist() == expected.tolist() == tokens[:, 0].tolist()
    assert expected[1] == 3 and expected[2] == 5
    assert positions.tolist() == [10 * s + 1 for s in range(slots)]
    assert counters.tolist() == [s + 1 for s in range(slots)]
