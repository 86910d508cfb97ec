"""Named torchtitan configs: ``{cell}_{size}_{parametrization}``, e.g. ``gdn_tiny_sp``, ``gammanet_340m_gdn-mup``.

``python -m linrnn.train --config NAME [--training.steps N ...]`` (torchtitan's ``--module`` points here);
``python -m linrnn.train --list-configs`` lists the names. Each config trains on the embedded corpus
(``linrnn.training.data``, prepared on first use) in packed windows that do not depend on the number of ranks
(``linrnn.training.loader``), with AdamW, a warmup and cosine decay, FSDP over two or more ranks (autocast on
one), checkpoints that resume, and validation in bits per byte on the whole held-out set. CLI flags override
any field torchtitan exposes (``--training.*``, ``--optimizer.lr``, ``--dataloader.dataset files
--dataloader.dataset_path DIR``, ...).

A size is the model preset of the same name (``linrnn.models.config.PRESETS``, ``linrnn presets``) with the
tokenizer's vocabulary, trained by the preset's ``TrainingRecipe``:

| size | model | tokenizer | seq_len × batch / rank | base width (muP) | AdamW lr |
|---|---|---|---|---|---|
| ``tiny`` | 4 layers, width 128, 2 heads (CPU) | 4096 | 256 × 16 | 64 | 3e-3 |
| ``paper-256`` … ``paper-1536`` | the GDN-muP paper's family: 8 layers, 6 heads | 4096 | 512 × 16 | 256 | 3e-3 |
| ``340m`` | 21 layers, width 1024, 6 heads | 32000 | 4096 × 4 | 256 | 1e-3 |
| ``1.3b`` | 20 layers, width 2048, 12 heads, activations recomputed | 32000 | 4096 × 4 | 256 | 6e-4 |

(``byte-tiny``, the byte-vocabulary preset of the tests and the demo, is not a training size.)
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.optimizer import LRSchedulersContainer
from torchtitan.config import DebugConfig, ParallelismConfig, TrainingConfig
from torchtitan.protocols.model_spec import ModelSpec

from linrnn.recurrences.registry import canonical_name
from linrnn.training import data
from linrnn.training.loader import WindowDataLoader
from linrnn.training.metrics import LinrnnMetrics
from linrnn.training.model import ReadoutLoss, TitanLanguageModel, parallelize
from linrnn.training.names import (  # noqa: F401  (re-exported: the names are part of this module's interface)
    PARAMETRIZATION_ALIASES,
    PARAMETRIZATIONS,
    SIZE_ALIASES,
    SIZES,
    Size,
    canonical_config_name,
    canonical_training_size,
    cells,
    config_names,
    parse_config_name,
    resolve_cell,
)
from linrnn.training.optim import ParametrizedOptimizers
from linrnn.training.state_dict_adapter import LinrnnStateDictAdapter
from linrnn.training.trainer import LinrnnTrainer, LinrnnValidator


def build(
    cell: str,
    size: str,
    parametrization: str,
    *,
    optimizer: str = "AdamW",
    readout_zero_init: bool = False,
    overrides: dict[str, Any] | None = None,
    base_width: int | None = None,
) -> LinrnnTrainer.Config:
    """The Trainer config of one named run (cell and parametrization as registry names, or a hybrid's name from
    ``names.HYBRIDS``; sizes above, an unknown one a ``UsageError`` naming them)."""
    size = canonical_training_size(size)
    spec = SIZES[size]
    model_cell, pattern = resolve_cell(cell)
    on_gpu = torch.cuda.is_available()
    data.register_datasets()
    data.prepare(vocab_sizes=(spec.vocab,))
    stats = data.corpus_stats()["tokenizers"][str(spec.vocab)]
    name = f"{cell}_{size}_{parametrization}"
    model = TitanLanguageModel.Config(
        cell=canonical_name(model_cell),
        preset=size,
        overrides={**spec.overrides, **({"layer_pattern": pattern} if pattern else {}), **(overrides or {})},
        parametrization=parametrization,
        base_width=base_width or spec.base_width,
        optimizer="adamw" if optimizer == "AdamW" else "sgd",
        readout_zero_init=readout_zero_init,
    )
    return LinrnnTrainer.Config(
        model_spec=ModelSpec(
            name="linrnn",
            flavor=name,
            model=model,
            parallelize_fn=parallelize,
            pipelining_fn=None,
            post_optimizer_build_fn=None,
            state_dict_adapter=LinrnnStateDictAdapter,  # to and from the HF folder (linrnn.models.hf)
        ),
        hf_assets_path=str(data.tokenizer_dir(spec.vocab)),
        dump_folder=f"outputs/{name}",
        loss=ReadoutLoss.Config(),
        optimizer=ParametrizedOptimizers.Config(
            name=optimizer, lr=spec.lr, implementation="fused" if on_gpu else "foreach"
        ),
        lr_scheduler=LRSchedulersContainer.Config(
            warmup_steps=max(1, spec.steps // 20), decay_type="cosine", min_lr_factor=0.1
        ),
        training=TrainingConfig(
            local_batch_size=spec.batch,
            seq_len=spec.seq_len,
            steps=spec.steps,
            max_norm=1.0,
            mixed_precision_param="bfloat16" if on_gpu else "float32",
            disable_cuda_graphs=True,
        ),
        # context parallelism splits rows contiguously (linrnn.training.trainer): no load balancer
        parallelism=ParallelismConfig(spmd_backend="partial_dtensor", context_parallel_load_balancer=None),
        dataloader=WindowDataLoader.Config(dataset="shakespeare"),
        validator=LinrnnValidator.Config(
            enable=True,
            freq=spec.checkpoint_interval,
            steps=-1,  # the whole held-out set
            dataloader=WindowDataLoader.Config(dataset="shakespeare_validation", infinite=False),
        ),
        metrics=LinrnnMetrics.Config(log_freq=10, bytes_per_token=stats["bytes_per_token"]),
        checkpoint=CheckpointManager.Config(
            enable=True, interval=spec.checkpoint_interval, last_save_model_only=False, keep_latest_k=2
        ),
        activation_checkpoint=None,
        debug=DebugConfig(seed=0),
    )


@functools.cache  # one function per name: looking it up twice gives the same function
def _named(cell: str, size: str, param: str):
    def config() -> LinrnnTrainer.Config:
        return build(cells()[cell], size, PARAMETRIZATIONS[param])

    config.__name__ = f"{cell}_{size}_{param}"
    config.__doc__ = f"{cell}, size {size}, parametrization {PARAMETRIZATIONS[param]} (linrnn.training.configs)"
    return config


def __getattr__(name: str):
    """One function per config name, older spellings too (torchtitan's --config looks them up here), for every
    mixer registered when it is looked up."""
    parsed = parse_config_name(name)
    if parsed is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _named(*parsed)
