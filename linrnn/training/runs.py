"""Run folders of ``linrnn train``: a manifest written at start, resume only into the same run, never a foreign folder.

A run folder holds torchtitan's ``checkpoint/``, ``metrics.jsonl``, and linrnn's ``linrnn-run.json`` (the
manifest), ``model.pt``, ``tokenizer/`` and ``training_curve.png``. The manifest names what the run trains: the
config, its torchtitan overrides, the data and the tokenizer (by content hash), and the linrnn version; at the end
it records the result. Checkpoints are read with torch's distributed-checkpoint reader, which unpickles their
``.metadata``: so a checkpoint folder is trusted input, and linrnn opens only folders with its own manifest.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from linrnn.errors import UsageError

MANIFEST = "linrnn-run.json"
OUTPUTS = (  # what a run writes into its folder (torchtitan's part: checkpoint/ and its logs and traces)
    *("checkpoint", "metrics.jsonl", "structured_logs", "comm_traces", "torchtitan.log"),
    *("model.pt", "tokenizer", "training_curve.png", MANIFEST),
)


@dataclass(frozen=True)
class Identity:
    """What must match for a run to resume: config name, torchtitan overrides (not the step count), data, tokenizer."""

    config: str
    overrides: tuple[str, ...]
    data: str
    tokenizer_sha256: str

    def describe(self) -> str:
        extra = f" {' '.join(self.overrides)}" if self.overrides else ""
        return f"{self.config}{extra} on {self.data} (tokenizer {self.tokenizer_sha256[:12]})"


def linrnn_version() -> str:
    try:
        return version("linrnn")
    except PackageNotFoundError:
        return "unknown"


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read_manifest(folder: Path) -> dict | None:
    """The folder's manifest, or None if it has none; a UsageError if it has one linrnn cannot read."""
    path = folder / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text())
        identity_of(manifest)  # the fields must be there
    except (ValueError, KeyError, TypeError) as error:
        raise UsageError(f"argument --out: {path} is not a linrnn run manifest ({error})") from error
    return manifest


def identity_of(manifest: dict) -> Identity:
    found = manifest["identity"]
    return Identity(**{**found, "overrides": tuple(found["overrides"])})


def open_run(folder: Path, identity: Identity, steps: int, fresh: bool) -> dict | None:
    """Checks ``folder`` before anything is loaded or written, and changes nothing; returns the manifest of the run
    to resume (None for a new run, or with ``fresh``). Refuses, with one line, a folder that holds files but no
    manifest (it may not be linrnn's, and its checkpoint would be unpickled) and a run of another identity unless
    ``fresh`` (then ``clear`` empties the folder of linrnn's outputs, once the rest of the run has been checked)."""
    manifest = read_manifest(folder) if folder.is_dir() else None
    if manifest is None:
        if folder.is_dir() and any(folder.iterdir()):
            raise UsageError(
                f"argument --out: expected an empty folder or a linrnn run folder (with {MANIFEST}), got {folder}, "
                f"which holds other files; linrnn loads checkpoints only from folders it wrote"
            )
        return None
    if fresh:
        return None
    found = identity_of(manifest)
    if found != identity:
        raise UsageError(
            f"argument --out: {folder} holds another run, {found.describe()}; this run is {identity.describe()} "
            f"(choose another --out, or --fresh to start over there)"
        )
    return manifest


def clear(folder: Path) -> None:
    """Deletes a run's outputs (``OUTPUTS``) from its folder: ``--fresh``."""
    for name in OUTPUTS:
        path = folder / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def write_manifest(folder: Path, identity: Identity, steps: int, result: dict | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    manifest = {
        "identity": {**identity.__dict__, "overrides": list(identity.overrides)},
        "steps": steps,
        "linrnn_version": linrnn_version(),
        "result": result,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def latest_step(folder: Path) -> int:
    """The step of the newest complete checkpoint in a run folder (one with its ``.metadata``, written last; one cut
    short by Ctrl-C has none, and torchtitan skips it too), 0 if none."""
    steps = [
        int(p.name.split("-")[1])
        for p in (folder / "checkpoint").glob("step-*")
        if p.name[5:].isdigit() and (p / ".metadata").is_file()
    ]
    return max(steps, default=0)
