"""The console of a torchtitan run: linrnn's progress lines there, torchtitan's chatter in the run folder.

torchtitan logs through the root logger (``torchtitan.tools.logging.logger``), and its ``init_logger()`` puts one
stdout handler on it at INFO. ``linrnn.train`` calls ``install()`` in its place:

- console (stdout), rank 0: linrnn's lines (loggers named ``linrnn.*``), a few torchtitan milestones (model size,
  batch, first step, checkpoint loaded, completed), and every warning and error;
- console, other ranks: warnings and errors only;
- ``{dump_folder}/torchtitan.log`` (rank 0): everything at INFO and above, once ``LinrnnMetrics`` knows the folder
  (``write_to``); lines logged before that wait in memory.

``install()`` also announces each validation with the number of held-out windows it is about to evaluate. Its
bits per byte read each window from a zero state (the recurrence restarts at every window), so they come out a little
above ``linrnn train``'s final figure, which reads each held-out document from its start in rows of 1024 tokens
(docs/training.md, "Validation during training and at the end").
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys

log = logging.getLogger("linrnn.train")

LOG_FILE = "torchtitan.log"
# torchtitan INFO lines that still reach the console (prefixes, colour codes removed)
MILESTONES = (
    "Model ",
    "Trainer is initialized",
    "Loading the checkpoint from",
    "Training starts at step",
    "Training completed",
)
# torchtitan warnings that do not apply to linrnn's runs: to the log file only
FALSE_ALARMS = (
    "initial_load_model_only=True has no effect",  # a torchtitan default; linrnn loads no initial checkpoint
    "Setting validation steps to -1 might cause hangs",  # linrnn's loader gives every rank as many batches
    "ENV[TORCH_NCCL_ASYNC_ERROR_HANDLING] = 1 will be overridden",  # torchrun's default, replaced by torchtitan
)
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
_file: _RunFile | None = None
_run_folder: str | None = None


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


class ConsoleFilter(logging.Filter):
    """Rank 0: linrnn's lines, torchtitan's milestones, warnings and errors; other ranks: warnings and errors."""

    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        message = _COLOUR.sub("", record.getMessage())
        if record.levelno >= logging.WARNING:
            return not message.startswith(FALSE_ALARMS)
        if self.rank != 0:
            return False
        return record.name.startswith("linrnn") or message.startswith(MILESTONES)


class ConsoleFormatter(logging.Formatter):
    """``HH:MM:SS [rank R] [LEVEL] message``: the rank on ranks other than 0, the level from WARNING up."""

    def __init__(self, rank: int):
        super().__init__(datefmt="%H:%M:%S")
        self.rank = rank

    def format(self, record: logging.LogRecord) -> str:
        head = self.formatTime(record, self.datefmt)
        if self.rank:
            head += f" rank {self.rank}"
        if record.levelno >= logging.WARNING:
            head += f" {record.levelname}"
        text = f"{head} {_COLOUR.sub('', record.getMessage())}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class _RunFile(logging.Handler):
    """Every record at INFO and above into the run's log file; records from before the file is known wait."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("[titan] %(asctime)s - %(name)s - %(levelname)s - %(message)s"))
        self.stream = None
        self.pending: list[logging.LogRecord] = []

    def open(self, path: str) -> None:
        if self.stream is not None:
            return
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self.stream = open(path, "a")
        for record in self.pending:
            self.emit(record)
        self.pending = []

    def emit(self, record: logging.LogRecord) -> None:
        if self.stream is None:
            if len(self.pending) < 10_000:  # a run that never names its folder keeps only its first lines
                self.pending.append(record)
            return
        try:
            self.stream.write(_COLOUR.sub("", self.format(record)) + "\n")
            self.stream.flush()
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None
        super().close()


def install() -> None:
    """Replaces the root logger's handlers (torchtitan's ``init_logger``) with linrnn's console and run file."""
    global _file, _run_folder
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    close()
    _run_folder = None
    for handler in list(root.handlers):
        root.removeHandler(handler)
    console = logging.StreamHandler(sys.stdout)
    console.addFilter(ConsoleFilter(rank()))
    console.setFormatter(ConsoleFormatter(rank()))
    root.addHandler(console)
    if rank() == 0:
        _file = _RunFile()
        root.addHandler(_file)
    import datasets

    datasets.disable_progress_bars()  # "Generating train split" bars for a corpus of a few MB: noise
    os.environ["KINETO_LOG_LEVEL"] = "5"  # as torchtitan's init_logger: no profiler chatter
    _announce_validations()


def write_to(dump_folder: str) -> None:
    """From now on (and for what was logged so far) the run file is ``{dump_folder}/torchtitan.log``."""
    global _run_folder
    _run_folder = dump_folder
    if _file is not None and _file.stream is None:
        path = os.path.join(dump_folder, LOG_FILE)
        _file.open(path)
        log.info(f"torchtitan's full log: {path}")


def run_folder() -> str | None:
    """The run's folder (torchtitan's dump folder), once the run has named it (``write_to``)."""
    return _run_folder


def close() -> None:
    """Closes and detaches the run file (``linrnn train`` goes on logging in the same process)."""
    global _file
    if _file is not None:
        logging.getLogger().removeHandler(_file)
        _file.close()
        _file = None


def _announce_validations() -> None:
    """Wraps torchtitan's ``Validator.validate`` so that a line says what is about to be evaluated."""
    from torchtitan.components.validate import Validator

    if getattr(Validator.validate, "announces", False):
        return
    validate = Validator.validate

    @functools.wraps(validate)
    def announcing(self, model_parts, step):
        self.dl_config = _Announcing(self.dl_config, self.config.steps, self.dp_world_size)
        try:
            return validate(self, model_parts, step)
        finally:
            self.dl_config = self.dl_config.inner

    announcing.announces = True
    Validator.validate = announcing


class _Announcing:
    """Stands in for the validator's dataloader config: builds the loader, then says how much it holds."""

    def __init__(self, inner, steps: int, ranks: int):
        self.inner, self.steps, self.ranks = inner, steps, ranks

    def build(self, **kwargs):
        loader = self.inner.build(**kwargs)
        # --validator.steps N takes N batches per rank; -1, one pass (linrnn's WindowDataLoader knows its length)
        calls = self.steps if self.steps > 0 else getattr(loader, "calls_per_epoch", None)
        if calls is None:
            log.info("validating on the held-out set…")
        else:
            windows = calls * kwargs["local_batch_size"] * self.ranks
            log.info(f"validating on the held-out set ({windows:,} windows of {kwargs['seq_len']} tokens, each read "
                     f"from a zero state)…")  # fmt: skip
        return loader
