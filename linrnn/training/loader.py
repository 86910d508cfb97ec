"""Packed batches that do not depend on how the global batch is split over ranks and micro-batches."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.loss import IGNORE_INDEX
from torchtitan.hf_datasets.text_datasets import _validate_dataset


class WindowDataLoader(BaseDataLoader):
    """Documents (``<s> text </s>``) concatenated into one token stream and cut into windows of ``seq_len + 1``
    tokens; each epoch visits the windows in a seeded random order. Call c of data-parallel rank r takes
    windows ``[(c · dp + r) · B, (c · dp + r + 1) · B)`` of that order, so a step's global batch is the same
    whether it runs on one GPU with batch 8 or on two with batch 4, with or without gradient accumulation.

    Positions count from 0 at every ``<s>`` and every row start, where the model restarts its state; targets
    that are ``<s>`` (the step from one document into the next) are ignored, so the loss per target matches the
    corpus's bytes per token. The state is the number of calls: a run resumes on any number of ranks.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        dataset: str = "shakespeare"
        seed: int = 0
        infinite: bool = True  # False: one pass over the windows (the remainder short of a global batch skipped)

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer,
        seq_len: int,
        local_batch_size: int,
        snapshot_every_n_steps: int = 1,
    ):
        path, load, text_of = _validate_dataset(config.dataset.lower(), config.dataset_path)
        stream: list[int] = []
        for sample in load(path):
            stream.extend(tokenizer.encode(text_of(sample), add_bos=True, add_eos=True))
        windows = (len(stream) - 1) // seq_len
        if windows < local_batch_size * dp_world_size:
            raise ValueError(
                f"dataset {config.dataset!r}: {len(stream)} tokens make {windows} windows of seq_len "
                f"{seq_len}, fewer than one global batch ({local_batch_size} × {dp_world_size} ranks)"
            )
        if tokenizer.bos_id is None:
            raise ValueError("the tokenizer has no bos_token (tokenizer_config.json): documents cannot be delimited")
        self.tokens = torch.tensor(stream[: windows * seq_len + 1], dtype=torch.long)
        self.config, self.bos = config, tokenizer.bos_id
        self.seq_len, self.batch, self.rank, self.ranks = seq_len, local_batch_size, dp_rank, dp_world_size
        self.calls_per_epoch = windows // (local_batch_size * dp_world_size)
        self.windows = windows
        self.calls = 0

    def __iter__(self):
        while self.config.infinite or self.calls < self.calls_per_epoch:
            epoch, call = divmod(self.calls, self.calls_per_epoch)
            order = torch.randperm(self.windows, generator=torch.Generator().manual_seed(self.config.seed + epoch))
            first = (call * self.ranks + self.rank) * self.batch
            rows = torch.stack(
                [
                    self.tokens[s : s + self.seq_len + 1]
                    for s in (order[first : first + self.batch] * self.seq_len).tolist()
                ]
            )
            inputs, labels = rows[:, :-1], rows[:, 1:].clone()
            labels[labels == self.bos] = IGNORE_INDEX
            self.calls += 1
            # every key besides "input" is a model-forward keyword: targets select the loss path (model.py)
            yield {"input": inputs, "positions": positions_since(inputs, self.bos), "targets": labels}, labels

    def state_dict(self) -> dict:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        if state:
            self.calls = int(state["calls"])


def positions_since(inputs: torch.Tensor, bos: int) -> torch.Tensor:
    """``[B, L]``: each token's index since the last ``bos`` in its row, or since the row start."""
    steps = torch.arange(inputs.shape[1]).expand_as(inputs)
    starts = torch.where(inputs == bos, steps, torch.zeros_like(steps))
    return steps - torch.cummax(starts, dim=1).values
