"""Training through torchtitan on CPU: 2-process gloo runs, exact resume, a repeated batch that is learned,
configs, data and the errors users hit. The embedded corpus is prepared once per session (package index)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from linrnn import train as entry
from linrnn.training.launch import free_port

pytest.importorskip("torchtitan")

SMALL = ["--training.local_batch_size", "2", "--training.seq_len", "64", "--metrics.log_freq", "1"]


def train(tmp_path: Path, name: str, *flags: str, processes: int = 1, run: str = "run") -> list[dict]:
    """Runs ``linrnn.train`` (under torchrun for several processes); returns the metrics.jsonl records."""
    out = tmp_path / run
    launcher = [sys.executable, "-m", "linrnn.train"]
    if processes > 1:
        launcher = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={processes}",
            f"--master_port={free_port()}",
            "-m",
            "linrnn.train",
        ]
    command = [*launcher, "--config", name, "--dump_folder", str(out), *SMALL, *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def losses(records: list[dict]) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records if "loss" in r}


@pytest.mark.parametrize("config", ["gdn_tiny_sp", "gdn-hybrid_tiny_gdn-mup"])  # a hybrid: 3 GDN to 1 attention
def test_two_process_gloo_run(corpus, tmp_path, config):
    records = train(
        tmp_path, config, "--training.steps", "3", "--checkpoint.no-enable", "--validator.steps", "2", processes=2
    )
    train_losses = losses(records)
    assert sorted(train_losses) == [1, 2, 3] and all(math.isfinite(v) for v in train_losses.values())
    assert train_losses[3] < train_losses[1]
    first = records[0]
    assert first["bpb"] == pytest.approx(first["loss"] / math.log(2) / _bytes_per_token(corpus))
    assert any("validation_bpb" in r for r in records)  # validation at step 1
    assert any(key.startswith("gates/layer0/beta") for r in records for key in r)


def test_context_parallel_run_equals_one_process(corpus, tmp_path):
    """``--parallelism.context_parallel_degree 2`` on two processes: each holds half of every row (documents cross
    the boundary), and the training and validation losses are those of one process on the same batches (fp32).
    (The logged gradient norms differ by ~5e-5 relative from one process's, as two data-parallel FSDP processes'
    do on the same batches, although the gradients themselves agree to ~4e-7 per parameter: the difference is in
    how the norm is reduced, not in the gradients.)"""
    common = ["--training.steps", "2", "--checkpoint.no-enable", "--validator.freq", "2", "--validator.steps", "1"]
    one = train(tmp_path, "gdn_tiny_sp", *common, run="one")
    split = train(tmp_path, "gdn_tiny_sp", *common, "--parallelism.context_parallel_degree", "2", processes=2,
                  run="split")  # fmt: skip
    for key in ("loss", "validation_loss"):
        expected = {r["step"]: r[key] for r in one if key in r}
        actual = {r["step"]: r[key] for r in split if key in r}
        assert sorted(actual) == sorted(expected) and expected, key
        for step, value in expected.items():
            assert actual[step] == pytest.approx(value, rel=1e-4), (key, step)


def _bytes_per_token(corpus: Path) -> float:
    return json.loads((corpus / "shakespeare" / "stats.json").read_text())["tokenizers"]["4096"]["bytes_per_token"]


def test_resume_reproduces_the_uninterrupted_run(corpus, tmp_path):
    """Stop after step 3 (a checkpoint there), resume to step 6: the losses equal an uninterrupted 6-step run's."""
    common = ["--lr_scheduler.total_steps", "6", "--checkpoint.interval", "3", "--validator.no-enable"]
    whole = losses(train(tmp_path, "gdn_tiny_sp", "--training.steps", "6", *common, processes=2, run="whole"))
    first = losses(train(tmp_path, "gdn_tiny_sp", "--training.steps", "3", *common, processes=2, run="split"))
    resumed = losses(train(tmp_path, "gdn_tiny_sp", "--training.steps", "6", *common, processes=2, run="split"))
    assert sorted(whole) == [1, 2, 3, 4, 5, 6]
    assert {s: whole[s] for s in (1, 2, 3)} == first
    assert {s: resumed[s] for s in (4, 5, 6)} == {s: whole[s] for s in (4, 5, 6)}


def test_a_one_process_checkpoint_resumes_on_two(corpus, tmp_path):
    """One process trains without FSDP (plain tensors), two with it (sharded): a checkpoint from the first resumes
    on the second, from its step and with its weights."""
    common = ["--lr_scheduler.total_steps", "6", "--checkpoint.interval", "3", "--validator.no-enable"]
    first = losses(train(tmp_path, "gdn_tiny_sp", "--training.steps", "3", *common, processes=1, run="split"))
    both = losses(train(tmp_path, "gdn_tiny_sp", "--training.steps", "6", *common, processes=2, run="split"))
    assert sorted(first) == [1, 2, 3] and sorted(both) == [1, 2, 3, 4, 5, 6]  # metrics.jsonl goes on
    assert all(math.isfinite(both[step]) for step in (4, 5, 6))
    log = (tmp_path / "split" / "torchtitan.log").read_text()
    assert f"Loading the checkpoint from {tmp_path / 'split' / 'checkpoint' / 'step-3'}" in log


def test_loss_falls_on_one_repeated_batch(corpus, tmp_path):
    """One document of exactly batch × seq_len inputs: every step sees the same batch, and 50 steps learn it."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(corpus / "shakespeare" / "tokenizer-4096" / "tokenizer.json"))
    text = json.loads((corpus / "shakespeare" / "validation.jsonl").read_text().splitlines()[0])["text"]
    wanted = 2 * 64 - 1  # <s> + tokens + </s> gives len + 1 inputs
    ids = tokenizer.encode(text).ids
    document = next(
        d for n in range(wanted, wanted - 20, -1) if len(tokenizer.encode(d := tokenizer.decode(ids[:n])).ids) == wanted
    )
    (tmp_path / "one.jsonl").write_text(json.dumps({"text": document}) + "\n")
    records = train(
        tmp_path,
        "gdn_tiny_sp",
        "--training.steps",
        "50",
        "--dataloader.dataset",
        "files",
        "--dataloader.dataset_path",
        str(tmp_path / "one.jsonl"),
        "--checkpoint.no-enable",
        "--validator.no-enable",
    )
    curve = losses(records)
    assert len(curve) == 50
    assert curve[50] < 0.5 * curve[1], curve


def test_configs_and_errors(corpus, tmp_path):
    from linrnn.training import compat

    compat.install()
    from linrnn.training import configs, data

    names = configs.config_names()
    assert {"gdn_tiny_sp", "gammanet_340m_gdn-mup", "kda_1.3b_mup", "gla_paper-512_sp"} <= set(names)
    assert len(names) == len(configs.cells()) * len(configs.SIZES) * 3
    assert "gdn-hybrid_tiny_sp" in names and "mamba2_tiny_mup" in names
    with pytest.raises(SystemExit, match="unknown config 'gdn_huge_sp'.*size in"):
        entry.main(["--config", "gdn_huge_sp"])
    with pytest.raises(SystemExit, match="--config NAME is required"):
        entry.main([])

    config = configs.build("gated_deltanet", "tiny", "sp")
    model = config.model_spec.model
    model.update_from_config(config=config)  # the corpus tokenizer fits
    small = type(model)(cell="gdn", preset="byte-tiny")  # the byte preset: 256 tokens
    with pytest.raises(ValueError, match="has 4096 tokens, more than the model's vocab_size 256"):
        small.update_from_config(config=config)

    with pytest.raises(FileNotFoundError, match="no files match"):
        data.load_text_files(str(tmp_path / "missing" / "*.jsonl"))
    (tmp_path / "empty.jsonl").write_text(json.dumps({"text": "  "}) + "\n")
    with pytest.raises(ValueError, match="are empty"):
        data.load_text_files(str(tmp_path / "empty.jsonl"))
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        data.tokenizer_vocab_size(str(tmp_path))


class CharTokenizer:
    """A stand-in for torchtitan's tokenizer: one token per character, <s> = 1, </s> = 2."""

    bos_id, eos_id = 1, 2

    def encode(self, text, add_bos=True, add_eos=True):
        return [1] * add_bos + [3 + ord(c) % 50 for c in text] + [2] * add_eos


def test_window_loader_batches_do_not_depend_on_the_rank_split(corpus, tmp_path):
    from linrnn.training import data
    from linrnn.training.loader import WindowDataLoader

    data.register_datasets()
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": "abcdefghij"[: 3 + i % 7] * (1 + i % 3)}) + "\n" for i in range(40)))
    config = WindowDataLoader.Config(dataset="files", dataset_path=str(docs), seed=5)

    def batches(ranks, batch, calls):
        loaders = [
            iter(
                WindowDataLoader(
                    config, dp_world_size=ranks, dp_rank=r, tokenizer=CharTokenizer(), seq_len=8, local_batch_size=batch
                )
            )
            for r in range(ranks)
        ]
        return [[next(loader) for loader in loaders] for _ in range(calls)]

    one = batches(1, 4, calls=6)
    two = batches(2, 2, calls=6)
    for (single,), pair in zip(one, two, strict=True):
        for key in ("input", "positions"):
            torch.testing.assert_close(single[0][key], torch.cat([p[0][key] for p in pair]))
        torch.testing.assert_close(single[1], torch.cat([p[1] for p in pair]))
    inputs, positions, labels = one[0][0][0]["input"], one[0][0][0]["positions"], one[0][0][1]
    assert (positions[inputs == 1] == 0).all() and (positions[:, 0] == 0).all()
    assert (labels != 1).all() and (labels == -100).any()  # targets that are <s> are ignored


def test_flops_per_token_counts_the_matrices():
    from linrnn.models.config import model_config
    from linrnn.training.model import flops_per_token

    config = model_config("gdn", "340m")
    flops = flops_per_token(config)
    with torch.device("meta"):
        import linrnn

        params = linrnn.build_model("gdn", "340m").num_parameters(exclude_embeddings=True)
    readout = config.hidden_size * config.vocab_size
    assert 6 * (params + readout) < flops < 1.2 * 6 * (params + readout)


def test_flops_per_token_of_attention_grow_with_the_sequence():
    from linrnn.models.config import model_config
    from linrnn.training.model import flops_per_token

    config = model_config("attention", "tiny")
    with pytest.raises(ValueError, match="argument 'seq_len' is needed for the attention layers"):
        flops_per_token(config)
    short, long = flops_per_token(config, seq_len=256), flops_per_token(config, seq_len=1280)
    with torch.device("meta"):
        from linrnn.models import LanguageModel

        mixer = LanguageModel(config).layers[0].mixer
    per_token = 6 * config.num_layers * mixer.num_heads * (mixer.head_k_dim + mixer.head_v_dim) / 2
    assert long - short == pytest.approx(per_token * 1024, abs=2)


def test_local_text_and_parquet_files(tmp_path):
    from linrnn.training import data

    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_text("first document\nwith two lines")
    (folder / "b.txt").write_text("second document")
    texts = sorted(data.load_text_files(str(folder))["text"])
    assert texts == ["first document\nwith two lines", "second document"]  # one document per file
    import datasets

    datasets.Dataset.from_dict({"text": ["x y z", "w"]}).to_parquet(str(tmp_path / "d.parquet"))
    assert data.load_text_files(str(tmp_path / "*.parquet"))["text"] == ["x y z", "w"]
    (folder / "c.jsonl").write_text('{"text": "mixed"}\n')
    with pytest.raises(ValueError, match="files of one kind"):
        data.load_text_files(str(folder))


def test_parametrization_reaches_the_torchtitan_model_and_optimizer(corpus):
    """init_weights applies the parametrization (init, multipliers); the optimizer's groups carry its lrs."""
    from linrnn.training import compat

    compat.install()
    from linrnn.training import configs
    from linrnn.training.model import TitanLanguageModel
    from linrnn.training.optim import ParametrizedOptimizers

    config = configs.build("gated_deltanet", "tiny", "gdn-mup", optimizer="SGD")
    spec = config.model_spec.model
    model = TitanLanguageModel(spec)
    model.init_weights()
    assert model.model.config.logit_multiplier == pytest.approx(64 / 128)  # base width 64, width 128
    assert model.model.layers[0].mixer.config.output_multiplier == pytest.approx(2.0)  # d_k / d_k0
    optimizer = ParametrizedOptimizers(ParametrizedOptimizers.Config(name="SGD", lr=0.1), model_parts=[model])
    lrs = {name: group["lr"] for opt in optimizer.optimizers for group in opt.param_groups
           for name in group["param_names"]}  # fmt: skip
    expected = model.applied.lr_multipliers()
    assert lrs["model.layers.0.mixer.b_proj.weight"] == pytest.approx(0.1 * 2**-0.5)  # W_β: m_in^-1/2
    assert lrs["model.layers.0.mixer.A_log"] == pytest.approx(0.1 * 2**0.5)  # gate scalar: m^1/2
    assert lrs == {f"model.{name}": pytest.approx(0.1 * multiplier) for name, multiplier in expected.items()}
    with pytest.raises(ValueError, match="parametrized for 'sgd' but --optimizer.name is 'AdamW'"):
        ParametrizedOptimizers(ParametrizedOptimizers.Config(name="AdamW"), model_parts=[model])


def test_the_loss_path_equals_the_logits_path(corpus, tmp_path):
    """With ``targets`` in the batch (linrnn's loader puts them there) the torchtitan model returns the summed
    cross-entropy through ``LanguageModel.loss``: equal to torchtitan's loss of the logits, gradients too; the
    trainer's loss (``ReadoutLoss``) divides it by the global token count as torchtitan's own does."""
    from linrnn.training import compat

    compat.install()
    from torchtitan.components.loss import cross_entropy_loss

    from linrnn.training import configs, data
    from linrnn.training.loader import WindowDataLoader
    from linrnn.training.model import ReadoutLoss, TitanLanguageModel

    config = configs.build("kda", "tiny", "gdn-mup")
    model = TitanLanguageModel(config.model_spec.model).double()
    model.init_weights()
    data.register_datasets()
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": "a short document " * (1 + i % 4)}) + "\n" for i in range(30)))
    loader = WindowDataLoader(WindowDataLoader.Config(dataset="files", dataset_path=str(docs)), dp_world_size=1,
                              dp_rank=0, tokenizer=CharTokenizer(), seq_len=40, local_batch_size=3)  # fmt: skip
    batch, labels = next(iter(loader))
    assert torch.equal(batch["targets"], labels) and (labels == -100).any()  # documents start inside the windows

    results, logits = [], None
    for with_targets in (False, True):
        model.zero_grad()
        kwargs = {"positions": batch["positions"], "targets": labels if with_targets else None}
        pred = model(batch["input"], **kwargs)
        logits = pred if not with_targets else logits
        loss = pred if with_targets else F.cross_entropy(pred.flatten(0, 1), labels.flatten(), reduction="sum")
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (expected, want), (loss, grads) = results
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, want[name], rtol=1e-9, atol=1e-12, msg=name)
    torch.testing.assert_close(cross_entropy_loss(logits.detach(), labels), expected.float())  # torchtitan's: fp32
    scaled, _ = ReadoutLoss(ReadoutLoss.Config())(loss, labels, torch.tensor(7.0, dtype=torch.float64))
    assert scaled == loss / 7


@pytest.mark.parametrize("policy, reshards", [("default", True), ("never", False), ("always", True)])
def test_parallelize_follows_the_reshard_after_forward_policy(policy, reshards):
    """``--parallelism.fsdp_reshard_after_forward`` reaches every block's ``fully_shard``: "never" keeps the
    gathered parameters from the forward to the backward (no second gather on one GPU)."""
    import types

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule

    from linrnn.training.model import TitanLanguageModel, parallelize

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
        model = TitanLanguageModel(TitanLanguageModel.Config(overrides={"num_layers": 2}))
        parallelism = types.SimpleNamespace(tensor_parallel_degree=1, pipeline_parallel_degree=1,
                                            context_parallel_degree=1, fsdp_reshard_after_forward=policy)  # fmt: skip
        training = types.SimpleNamespace(mixed_precision_param="bfloat16", mixed_precision_reduce="float32")
        # a one-rank mesh standing in for two ranks' (one rank gets no FSDP: the next test)
        dims = types.SimpleNamespace(get_mesh=lambda name: mesh, world_size=2)
        parallelize(model, parallel_dims=dims, training=training, parallelism=parallelism,
                    compile_config=types.SimpleNamespace(enable=False), ac_config=None, dump_folder="")  # fmt: skip
        for block in model.model.layers:
            assert isinstance(block, FSDPModule)
            group = block._get_fsdp_state()._fsdp_param_group
            assert (group.post_forward_mesh_info is not None) == reshards
    finally:
        if started:
            dist.destroy_process_group()


@pytest.mark.parametrize("param_dtype", ["bfloat16", "float32"])
def test_one_rank_trains_without_fsdp_under_autocast(param_dtype):
    """On one rank ``parallelize`` applies no FSDP; ``mixed_precision_param`` bf16 becomes autocast over the fp32
    parameters (the mixer's projections run in bf16, the parameters and their gradients stay fp32), fp32 none.
    Built as torchtitan builds it (meta device, ``to_empty``, ``init_weights``): the tied readout stays tied."""
    import types

    from torch.distributed.fsdp import FSDPModule

    from linrnn.training.model import TitanLanguageModel, parallelize

    torch.manual_seed(0)
    with torch.device("meta"):
        model = TitanLanguageModel(TitanLanguageModel.Config(overrides={"num_layers": 2, "tie_embeddings": True}))
    training = types.SimpleNamespace(mixed_precision_param=param_dtype, mixed_precision_reduce="float32")
    parallelism = types.SimpleNamespace(tensor_parallel_degree=1, pipeline_parallel_degree=1,
                                        context_parallel_degree=1, fsdp_reshard_after_forward="default")  # fmt: skip
    dims = types.SimpleNamespace(world_size=1, get_mesh=lambda name: pytest.fail("no mesh on one rank"))
    parallelize(model, parallel_dims=dims, training=training, parallelism=parallelism,
                compile_config=types.SimpleNamespace(enable=False), ac_config=None, dump_folder="")  # fmt: skip
    assert not any(isinstance(module, FSDPModule) for module in model.modules())
    model.to_empty(device="cpu")
    model.init_weights()
    assert model.model.lm_head.weight is model.model.embed.weight
    seen = []
    model.model.layers[0].mixer.register_forward_hook(lambda module, args, out: seen.append(out[0].dtype))
    tokens = torch.randint(0, 256, (2, 16))
    loss = model(tokens, targets=tokens)
    loss.backward()
    assert seen == [getattr(torch, param_dtype)]
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters())
