"""Back-fills that let torchtitan 0.3.0 run on the torch versions linrnn supports, and on hosts without GPUs.

``install()`` must run before ``torchtitan.train`` (or anything that imports ``torchtitan.tools.utils``'s
device names) is imported; ``python -m linrnn.train`` does that first.

- torch 2.11 (the GPU machines): ``torch.distributed.fsdp.DataParallelMeshDims`` does not exist yet; torchtitan
  imports it for FSDP helpers linrnn does not use, so a same-shaped dataclass stands in.
- torch 2.13: ``torch.distributed.set_timeout`` does not exist yet; torchtitan calls it after the first step.
  ``distributed_c10d._set_pg_timeout`` is the same operation under its older private name.
- No accelerator: torchtitan falls back to device type "cuda" and calls ``torch.cuda.set_device``; it is pointed
  at the CPU instead (process groups then use gloo), with a device module that answers its memory queries. A CPU
  has no peak FLOPS to compute MFU against: ``get_peak_flops`` answers NaN there, instead of probing ``lspci`` and
  warning that it falls back to an A100's. torch's warnings that DTensor random ops may not work on a CPU mesh
  are silenced: linrnn draws its initial weights on one CPU and distributes them (``linrnn.training.model``).
- Resuming: torchtitan's ``LRSchedulersContainer.load_state_dict`` recomputes each scheduler's learning rate with
  ``get_lr()`` outside ``step()``, which torch answers with a UserWarning ("To get the last learning rate computed
  by the scheduler, please use `get_last_lr()`") on every resume. The value is right (it is what ``step()`` would
  compute); the call is made inside torch's own ``_enable_get_lr_call``, as ``step()`` does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import types
import warnings

import torch
import torch.distributed as dist

_installed = False


def install() -> str:
    """Applies the back-fills once; returns the device type torchtitan will use ("cuda" or "cpu")."""
    global _installed
    import torch.distributed.fsdp as fsdp

    if not hasattr(fsdp, "DataParallelMeshDims"):

        @dataclasses.dataclass
        class DataParallelMeshDims:
            shard: str | tuple[str, ...] | None = None
            replicate: str | tuple[str, ...] | None = None

        fsdp.DataParallelMeshDims = DataParallelMeshDims
    if not hasattr(dist, "set_timeout"):
        dist.set_timeout = lambda timeout, group=None: dist.distributed_c10d._set_pg_timeout(timeout, group)

    import torchtitan.tools.utils as titan_utils

    if not torch.cuda.is_available() and not _installed:
        titan_utils.device_type, titan_utils.device_module = "cpu", _cpu_device_module()
        titan_utils.get_peak_flops = lambda device_name: float("nan")
        warnings.filterwarnings("ignore", r"DTensor .* may not have complete support on cpu device mesh")
    _quiet_scheduler_resume()  # after the device names: it imports torchtitan modules that read them
    _installed = True
    return titan_utils.device_type


def _quiet_scheduler_resume() -> None:
    """torchtitan's scheduler ``load_state_dict`` with its ``get_lr()`` calls marked as within a step (module
    docstring)."""
    from torch.optim import lr_scheduler
    from torchtitan.components.optimizer import LRSchedulersContainer

    load = LRSchedulersContainer.load_state_dict
    if getattr(load, "quiet", False) or not hasattr(lr_scheduler, "_enable_get_lr_call"):
        return

    def load_state_dict(self, state_dict):
        with contextlib.ExitStack() as within_step:
            for scheduler in self.schedulers:
                within_step.enter_context(lr_scheduler._enable_get_lr_call(scheduler))
            load(self, state_dict)

    load_state_dict.quiet = True
    LRSchedulersContainer.load_state_dict = load_state_dict


def _cpu_device_module() -> types.SimpleNamespace:
    """What torchtitan asks of ``torch.cuda``, answered for the CPU (memory statistics are not tracked)."""
    host_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    properties = types.SimpleNamespace(total_memory=host_memory, name="CPU")
    return types.SimpleNamespace(
        is_available=lambda: True,
        device_count=lambda: 1,
        set_device=lambda device: None,
        current_device=lambda: 0,
        synchronize=lambda *args: None,
        get_device_name=lambda device=None: "CPU",
        get_device_properties=lambda device=None: properties,
        reset_peak_memory_stats=lambda *args: None,
        empty_cache=lambda: None,
        memory_stats=lambda device=None: {},
    )
