"""linrnn's ``LanguageModel`` as a torchtitan model: config, flop count, weight init, FSDP.

torchtitan builds the model on the meta device, shards it (``parallelize``), allocates it with ``to_empty`` and
then calls ``init_weights``. Here ``init_weights`` builds the same model on the CPU from the run's seed, applies
the parametrization (per-role init and multipliers, ``linrnn.parametrizations``) and copies every tensor into
its shard, so a run starts from the same weights on any number of GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torchtitan.components.loss import IGNORE_INDEX, BaseLoss, cross_entropy_loss
from torchtitan.protocols import BaseModel

from linrnn import parametrizations
from linrnn.models import LanguageModel
from linrnn.models.config import ModelConfig, model_config
from linrnn.recurrences.base import LinearRNNMixer, ShortConv


class TitanLanguageModel(BaseModel):
    """``model(tokens [B, L], positions=[B, L])`` → logits ``[B, L, vocab]``; packed documents restart the
    recurrence where positions are 0 (``LanguageModel``'s varlen path)."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseModel.Config):
        cell: str = "gated_deltanet"
        preset: str = "byte-tiny"
        overrides: dict[str, Any] = field(default_factory=dict)  # ModelConfig fields and mixer options
        parametrization: str = "sp"
        base_width: int = 64
        optimizer: str = "adamw"  # which parametrization table applies: "adamw" or "sgd"
        readout_zero_init: bool = False
        base_num_heads: int | None = None  # the base model's, when heads grow with width (default: the model's)
        seed: int = 0  # the run's seed (debug.seed), taken in update_from_config

        def model_config(self) -> ModelConfig:
            return model_config(self.cell, self.preset, **self.overrides)

        def update_from_config(self, *, config, **kwargs) -> None:
            """Checks that the tokenizer fits the model's vocabulary; takes the run's seed."""
            from linrnn.training.data import tokenizer_vocab_size

            vocab = self.model_config().vocab_size
            tokens = tokenizer_vocab_size(config.hf_assets_path)
            if tokens > vocab:
                raise ValueError(
                    f"the tokenizer in {config.hf_assets_path} has {tokens} tokens, more than the "
                    f"model's vocab_size {vocab}; use a tokenizer of at most {vocab} tokens"
                )
            if config.debug.seed is not None:
                self.seed = config.debug.seed

        def get_nparams_and_flops(self, model: nn.Module, seq_len: int) -> tuple[int, int]:
            return sum(p.numel() for p in model.parameters()), flops_per_token(self.model_config(), seq_len=seq_len)

    def __init__(self, config: Config):
        super().__init__()
        self.config = config
        self.model = LanguageModel(config.model_config())
        self.applied: parametrizations.Applied | None = None
        self.autocast_dtype: torch.dtype | None = None  # mixed precision without FSDP (one rank: ``parallelize``)

    def verify_module_protocol(self) -> None:
        """The wrapped model is plain ``nn.Module``s; ``init_weights`` below initialises all of it."""

    def forward(self, tokens: Tensor, positions: Tensor | None = None, targets: Tensor | None = None) -> Tensor:
        """Logits ``[B, L, vocab]``; with ``targets`` (linrnn's loaders pass them) the summed cross-entropy over the
        targets that are not ``IGNORE_INDEX`` instead, through ``LanguageModel.loss``: no ``[B, L, vocab]`` logits,
        and under FSDP the readout weight is gathered for this forward like every other root parameter."""
        with torch.autocast(tokens.device.type, self.autocast_dtype, enabled=self.autocast_dtype is not None):
            if targets is None:
                return self.model(tokens, positions=positions)
            return self.model.loss(tokens, targets, positions=positions, ignore_index=IGNORE_INDEX, reduction="sum")

    @torch.no_grad()
    def init_weights(self, buffer_device=None, **kwargs) -> None:
        from torch.distributed.tensor import DTensor, distribute_tensor

        cfg = self.config
        model = self.model
        if model.config.tie_embeddings and model.lm_head.weight is not model.embed.weight:
            model.lm_head.weight = model.embed.weight  # to_empty gave each module its own copy (FSDP keeps one)
        torch.manual_seed(cfg.seed)
        with torch.device("cpu"):
            source = LanguageModel(cfg.model_config())
        self.applied = parametrizations.apply(
            source,
            cfg.parametrization,
            base_width=cfg.base_width,
            optimizer=cfg.optimizer,
            readout_zero_init=cfg.readout_zero_init,
            base_num_heads=cfg.base_num_heads,
        )
        # the multipliers apply lives in the configs
        self.model.config.logit_multiplier = source.config.logit_multiplier
        for layer, source_layer in zip(self.model.layers, source.layers, strict=True):
            layer.mixer.config.output_multiplier = source_layer.mixer.config.output_multiplier
        targets = dict(self.model.named_parameters())
        for name, value in source.named_parameters():
            target = targets[name]
            if isinstance(target, DTensor):
                value = distribute_tensor(value.to(target.device, target.dtype), target.device_mesh, target.placements)
            target.copy_(value)
        self.applied.model = self.model  # param_groups resolves names against the trained model


class ReadoutLoss(BaseLoss):
    """torchtitan's loss for linrnn's models: the model's output is already the summed cross-entropy when the batch
    carried ``targets`` (``TitanLanguageModel.forward``); logits otherwise get torchtitan's summed cross-entropy.
    The trainer divides by the global number of target tokens, as for its own loss."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseLoss.Config):
        pass

    def __init__(self, config: Config, *, compile_config=None):
        self.fn = _summed_loss
        self._maybe_compile(compile_config)


def _summed_loss(pred: Tensor, labels: Tensor) -> Tensor:
    return pred if pred.dim() == 0 else cross_entropy_loss(pred, labels)


def flops_per_token(config: ModelConfig, chunk_size: int = 64, seq_len: int | None = None) -> int:
    """Training FLOPs per token (forward + backward = 3 × forward, 2 FLOPs per multiply-add).

    Matrices: 6 × (parameters outside the embedding, plus the readout's hidden × vocab when it is tied). The
    chunkwise recurrence per layer and head: the causal intra-chunk products ``Q Kᵀ`` and ``A V`` (C/2 keys on
    average: C (K + V) multiply-adds per token) and the state read and write (2 K V), so 6 × (C (K + V) / 2 +
    2 K V) per token; the WY / UT transforms of the delta rule are of the same order and are not counted.
    Softmax attention (``attention`` layers) reads T/2 keys on average: 6 × T (K + V) / 2 per head, which needs
    ``seq_len`` (T).
    """
    with torch.device("meta"):
        model = LanguageModel(config)
    matrices = model.num_parameters(exclude_embeddings=True) + (
        config.hidden_size * config.vocab_size if config.tie_embeddings else 0
    )
    mixing = 0.0
    for layer in model.layers:
        mixer = layer.mixer
        k, v, heads = mixer.head_k_dim, mixer.head_v_dim, mixer.num_heads
        if isinstance(mixer, LinearRNNMixer):
            mixing += heads * (chunk_size * (k + v) / 2 + 2 * k * v)
        elif seq_len is None:
            raise ValueError(f"flops_per_token: argument 'seq_len' is needed for the {mixer.cell} layers, got None")
        else:
            mixing += heads * seq_len * (k + v) / 2
    return int(6 * matrices + 6 * mixing)


def check_context_parallel(model: LanguageModel, degree: int, seq_len: int, parallelism) -> None:
    """A ``ValueError`` naming the setting when the model or the run cannot be split along time over ``degree``
    ranks (``linrnn.kernels.context_parallel``)."""
    attention = [i for i, cell in enumerate(model.config.layer_cells) if cell == "attention"]
    if attention:
        raise ValueError(
            f"parallelism.context_parallel_degree {degree}: softmax attention layers (layers {attention}) cannot "
            f"split a sequence over ranks yet; context parallelism takes models of recurrent layers only"
        )
    if parallelism.context_parallel_load_balancer is not None:
        raise ValueError(
            f"parallelism.context_parallel_load_balancer must be None for linrnn models (their rows are split into "
            f"contiguous slices: a recurrence reads its tokens in order), got "
            f"{parallelism.context_parallel_load_balancer!r}"
        )
    halo = max((module.kernel_size - 1 for module in model.modules() if isinstance(module, ShortConv)), default=0)
    if seq_len % degree or seq_len // degree < max(halo, 1):
        raise ValueError(
            f"training.seq_len ({seq_len}) must be a multiple of parallelism.context_parallel_degree ({degree}) "
            f"with slices of at least {max(halo, 1)} tokens (the short convolution's history)"
        )


def parallelize(
    model: TitanLanguageModel, *, parallel_dims, training, parallelism, compile_config, ac_config, dump_folder
) -> TitanLanguageModel:
    """FSDP over the data-parallel ranks: one unit per block plus the root (embedding, final norm, readout). On
    one rank there is nothing to shard: no FSDP, and mixed precision (``training.mixed_precision_param``) by
    autocast over the fp32 parameters, as torchtitan documents for single-device training. FSDP on one GPU
    gathered and cast every block's parameters each step and ran per-block hooks on the host: at 340M, 4×4096,
    compiled, the GPU was busy 29% of a profiled step."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.distributed.fsdp import disable_fsdp_gradient_division, get_fsdp_reshard_after_forward_policy

    unsupported = [
        name
        for name, degree in (
            ("tensor", parallelism.tensor_parallel_degree),
            ("pipeline", parallelism.pipeline_parallel_degree),
        )
        if degree > 1
    ]
    if unsupported:
        raise ValueError(
            f"linrnn models support data parallelism (FSDP) and context parallelism only; got "
            f"{', '.join(unsupported)} parallelism degree > 1"
        )
    if parallelism.context_parallel_degree > 1:
        check_context_parallel(model.model, parallelism.context_parallel_degree, training.seq_len, parallelism)
        model.model.context_group = parallel_dims.get_mesh("cp").get_group()
    if compile_config.enable and "model" in compile_config.components:
        for block in model.model.layers:
            block.compile(backend=compile_config.backend)  # in place: parameter names stay
    if parallel_dims.world_size == 1:
        param_dtype = TORCH_DTYPE_MAP[training.mixed_precision_param]
        model.autocast_dtype = None if param_dtype == torch.float32 else param_dtype
        return model
    mesh = parallel_dims.get_mesh("fsdp")
    policy = MixedPrecisionPolicy(
        param_dtype=TORCH_DTYPE_MAP[training.mixed_precision_param],
        reduce_dtype=TORCH_DTYPE_MAP[training.mixed_precision_reduce],
        cast_forward_inputs=False,
    )
    # --parallelism.fsdp_reshard_after_forward: "never" keeps each block's gathered (bf16) parameters from the
    # forward to the backward instead of gathering them again; "default" reshards (without pipeline parallelism)
    reshard = get_fsdp_reshard_after_forward_policy(parallelism.fsdp_reshard_after_forward, pp_enabled=False)
    for block in model.model.layers:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    disable_fsdp_gradient_division(model)  # torchtitan's loss is already divided by the global token count
    if not torch.cuda.is_available():  # gloo has no PREMUL_SUM
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
    return model
