"""torchtitan's metrics plus what linrnn adds: bits per byte, per-layer gate statistics, a JSON-lines log.

Each logged step is one console line (loss, bpb, grad norm, tokens/s, TFLOPS, mean β per layer; on a GPU also the
peak memory and MFU) in place of torchtitan's own, which goes to ``{dump_folder}/torchtitan.log``
(``linrnn.training.logs``). Every logged step also goes to ``{dump_folder}/metrics.jsonl`` (rank 0): step, loss,
bpb, grad norm, tokens/s per device, MFU (None on a CPU, which has no peak to compare with), learning rate, and per
layer the mean write strength β and the mean decay exp(g) of the last micro-batch. Validation lines carry
``validation_loss`` and ``validation_bpb``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torchtitan.components.metrics import MetricsProcessor

from linrnn.recurrences.base import LinearRNNMixer
from linrnn.training import logs


class LinrnnMetrics(MetricsProcessor):
    @dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        bytes_per_token: float = 0.0
        """Validation bytes per predicted token of the run's corpus and tokenizer (0: no bpb)."""

    def __init__(self, config: Config, **kwargs):
        super().__init__(config, **kwargs)
        self.dump_folder = kwargs.get("dump_folder", "./outputs")
        self.on_cpu = not torch.cuda.is_available()
        self.logger = _Recording(self.logger)  # keeps the last metrics torchtitan computed (tps, mfu)
        logs.write_to(self.dump_folder)  # torchtitan's log file, now that the run folder is known

    def _bpb(self, loss: float) -> float | None:
        per_token = self.config.bytes_per_token
        return loss / math.log(2) / per_token if per_token > 0 else None

    def _mixers(self) -> list[LinearRNNMixer]:
        mixers = [m for m in self.model_parts[0].modules() if isinstance(m, LinearRNNMixer)] if self.model_parts else []
        for mixer in mixers:
            if mixer.gate_stats is None:
                mixer.gate_stats = {}  # from now on each forward records them
        return mixers

    def log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
        extra = dict(extra_metrics or {})
        bpb = self._bpb(global_avg_loss)
        if bpb is not None:
            extra["loss_metrics/bpb"] = bpb
        betas = []
        for i, mixer in enumerate(self._mixers()):
            for name, value in mixer.gate_stats.items():
                extra[f"gates/layer{i}/{name}"] = float(value)
            if "beta" in mixer.gate_stats:
                betas.append(f"{float(mixer.gate_stats['beta']):.2f}")
        super().log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra)
        computed = self.logger.last
        record = {
            "step": step,
            "loss": global_avg_loss,
            "bpb": bpb,
            "grad_norm": float(grad_norm),
            "tokens_per_s": computed.get("throughput(tps)"),
            "tflops": computed.get("tflops"),
            "mfu": None if self.on_cpu else computed.get("mfu(%)"),
        }
        record.update({k: v for k, v in computed.items() if k.startswith(("lr/", "gates/"))})
        self._write(record)
        fields = [f"step {step}", f"loss {global_avg_loss:.4f}"] + ([f"bpb {bpb:.4f}"] if bpb is not None else [])
        fields += [f"grad_norm {float(grad_norm):.3f}", f"tps {round(computed['throughput(tps)']):,}"]
        fields += [f"tflops {computed['tflops']:.2f}", *self._gpu_fields(computed, "memory/")]
        if not self.on_cpu and "mfu(%)" in computed:  # a CPU has no peak to compare with
            fields.append(f"mfu {computed['mfu(%)']:.1f}%")
        logs.log.info("  ".join(fields + ([f"β per layer {' '.join(betas)}"] if betas else [])))

    def log_validation(self, loss, step, extra_metrics=None):
        extra = dict(extra_metrics or {})
        bpb = self._bpb(loss)
        if bpb is not None:
            extra["validation_metrics/bpb"] = bpb
        super().log_validation(loss, step, extra_metrics=extra)
        self._write({"step": step, "validation_loss": loss, "validation_bpb": bpb})
        computed = self.logger.last
        fields = [f"validation at step {step}: loss {loss:.4f}"] + ([f"bpb {bpb:.4f}"] if bpb is not None else [])
        fields.append(f"tps {round(computed['validation_metrics/throughput(tps)']):,}")
        logs.log.info("  ".join(fields + self._gpu_fields(computed, "validation_metrics/memory/")))

    def _gpu_fields(self, computed: dict, prefix: str) -> list[str]:
        """The peak memory torchtitan measured, on a GPU (a CPU's is not tracked)."""
        if self.on_cpu:
            return []
        return [f"memory {computed[prefix + 'max_reserved(GiB)']:.2f}GiB ({computed[prefix + 'max_reserved(%)']:.0f}%)"]

    def _write(self, record: dict) -> None:
        if dist.is_initialized() and dist.get_rank() != 0:
            return
        os.makedirs(self.dump_folder, exist_ok=True)
        with open(os.path.join(self.dump_folder, "metrics.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")


class _Recording:
    """A torchtitan metric logger that remembers the last dict it was given."""

    def __init__(self, inner):
        self.inner, self.last = inner, {}

    def log(self, metrics: dict, step: int) -> None:
        self.last = dict(metrics)
        self.inner.log(metrics, step)

    def close(self) -> None:
        self.inner.close()
