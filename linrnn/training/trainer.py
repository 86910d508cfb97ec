"""torchtitan's trainer and validator for linrnn's models, with linrnn's context parallelism
(``--parallelism.context_parallel_degree R``).

torchtitan's own context parallelism reorders each row for softmax attention (head-tail load balancing) and
shards only ``input``, ``labels`` and ``positions``. A recurrence needs the tokens in order, and linrnn's batches
also carry ``targets`` (``linrnn.training.loader``), so the trainer and the validator here split every ``[B, L]``
tensor of a batch into R contiguous slices along time instead, rank r of the context-parallel group keeping the
r-th; the model passes states and short-conv inputs between the ranks (``linrnn.kernels.context_parallel``,
``LanguageModel.context_group``, set by ``linrnn.training.model.parallelize``). Every rank of a context-parallel
group reads the same batch (torchtitan's data-parallel rank counts only the data-parallel degrees); the loss is
summed per rank and divided by the whole batch's target count, and FSDP shards over data- and context-parallel
ranks together, so gradients and the logged loss are those of the unsplit batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torchtitan.components.validate import Validator
from torchtitan.trainer import Trainer


def split_batch(input_dict: dict[str, torch.Tensor], labels: torch.Tensor, mesh) -> tuple[Any, Any, dict]:
    """(inputs, labels, the model's keyword arguments): this rank's slice along time of each ``[B, L]`` tensor."""
    rank, ranks = mesh.get_local_rank(), mesh.size()
    length = labels.shape[1]
    if length % ranks:
        raise ValueError(
            f"context parallelism: training.seq_len ({length}) must be a multiple of "
            f"parallelism.context_parallel_degree ({ranks})"
        )
    piece = slice(rank * length // ranks, (rank + 1) * length // ranks)
    sliced = {name: x[:, piece] for name, x in input_dict.items()}
    inputs = sliced.pop("input")
    return inputs, labels[:, piece], sliced


class LinrnnTrainer(Trainer):
    """torchtitan's ``Trainer`` with linrnn's contiguous split of each batch (module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        pass

    def post_dataloading_process(self, input_dict, labels):
        if not self.parallel_dims.cp_enabled:
            return super().post_dataloading_process(input_dict, labels)
        inputs, labels, extra = split_batch(input_dict, labels, self.parallel_dims.get_mesh("cp"))
        self.ntokens_seen += labels.numel()
        return inputs, labels, extra


class LinrnnValidator(Validator):
    """torchtitan's ``Validator`` with the same split."""

    @dataclass(kw_only=True, slots=True)
    class Config(Validator.Config):
        pass

    def post_dataloading_process(self, input_dict, labels, model_parts):
        if not self.parallel_dims.cp_enabled:
            return super().post_dataloading_process(input_dict, labels, model_parts)
        return split_batch(input_dict, labels, self.parallel_dims.get_mesh("cp"))
