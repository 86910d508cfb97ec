"""Reading Hugging Face folders (linrnn's own and FLA's): their JSON files and their safetensors weight files, checked
before any weight is read. Pickled weights are named in the refusal and never opened."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from linrnn.errors import UsageError, one_line

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


def read_json(path: Path, where: str) -> Any:
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"{where}: {path.name} is not JSON ({one_line(error)})") from error


def safetensors_files(folder: Path, where: str) -> list[Path]:
    """The weight files of ``folder``: the shards that ``model.safetensors.index.json`` names (each a plain
    ``*.safetensors`` name in the folder), else ``model.safetensors``; a ``UsageError`` starting with ``where``
    otherwise, naming the pickle when the weights are only pickled."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        contents = read_json(index, where)
        weight_map = contents.get("weight_map") if isinstance(contents, dict) else None
        if not isinstance(weight_map, dict):
            raise UsageError(f"{where}: {index.name} must hold a 'weight_map' object (tensor name → shard file)")
        shards = sorted(set(map(str, weight_map.values())))
        for shard in shards:
            if Path(shard).name != shard or not shard.endswith(".safetensors"):
                raise UsageError(f"{where}: {index.name} names {shard!r}, expected safetensors file names")
            if not (folder / shard).is_file():
                raise UsageError(f"{where}: the index names shard {shard!r}, which is not in the folder")
        return [folder / shard for shard in shards]
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    pickles = sorted(path.name for path in folder.iterdir() if path.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise UsageError(f"{where}: holds its weights only as pickles ({pickles[0]}, never opened); linrnn reads "
                         f"safetensors and does not unpickle files it did not write (save with "
                         f"save_pretrained(..., safe_serialization=True))")  # fmt: skip
    raise UsageError(f"{where}: expected model.safetensors or model.safetensors.index.json, found neither")
