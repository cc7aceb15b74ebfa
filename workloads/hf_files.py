"""The safetensors files of a Hugging Face model directory: which file holds which tensor (one
model.safetensors, or shards named by model.safetensors.index.json), and a check, from the
files' headers only, that every tensor the model needs is there with its shape. No torch:
the config validator runs it before anything starts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from workloads.flavours import ModelFlavour
from workloads.hf_config import IGNORED_SUFFIXES, INDEX, SINGLE_FILE, HFModelError, hf_name, parameter_shapes


def _header_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, from a safetensors header (safetensors itself validates the file:
    a truncated or corrupt one is refused here)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as fh:
            return {key: tuple(fh.get_slice(key).get_shape()) for key in fh.keys()}
    except Exception as err:  # SafetensorError, OSError: the message is what the user needs
        raise HFModelError(f"{path}: not a readable safetensors file ({str(err).splitlines()[0]})") from None


def weight_map(model_dir: str | Path) -> dict[str, Path]:
    """Hugging Face tensor name -> the file that holds it."""
    root = Path(model_dir).expanduser().resolve()
    index = root / INDEX
    if index.is_file():
        try:
            names = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise HFModelError(f"{index}: not a safetensors index (weight_map missing or invalid: {err})") from None
        files = {name: _shard(root, index, name, file) for name, file in _entries(names, index)}
        for file in sorted(set(files.values())):
            if not file.is_file():
                raise HFModelError(f"{file}: not found (named in {INDEX})")
        return files
    single = root / SINGLE_FILE
    if not single.is_file():
        raise HFModelError(f"{root}: no {SINGLE_FILE} and no {INDEX} (only safetensors weights are read)")
    return {name: single for name in _header_shapes(single)}


def _entries(names, index: Path) -> list[tuple[str, str]]:
    if not isinstance(names, dict) or not all(isinstance(v, str) for v in names.values()):
        raise HFModelError(f"{index}: weight_map must map tensor names to file names")
    return list(names.items())


def _shard(root: Path, index: Path, name: str, file: str) -> Path:
    """The file an index entry names, which must lie in the model directory: an entry such as
    ../../etc/passwd is refused, never opened. Checked on the name, not on where symbolic links
    lead: the Hugging Face cache links every file of a snapshot to a blob outside it."""
    path = Path(os.path.normpath(root / file))
    if not path.is_relative_to(root):
        raise HFModelError(f"{index}: weight_map entry {name}: {file} is outside the model directory")
    return path


def check_weights(model_dir: str | Path, flavour: ModelFlavour) -> None:
    """Refuse (one line) a directory whose files lack a tensor of the model, hold one of another
    shape, or hold one the model does not have (biases where it has none, another architecture)."""
    files = weight_map(model_dir)
    shapes: dict[str, tuple[int, ...]] = {}
    where: dict[str, Path] = {}
    for file in sorted(set(files.values())):
        for name, shape in _header_shapes(file).items():
            shapes[name], where[name] = shape, file
    expected = {hf_name(k): v for k, v in parameter_shapes(flavour).items()}
    for name, shape in expected.items():
        if name not in shapes:
            raise HFModelError(f"{files.get(name, Path(model_dir).expanduser().resolve())}: tensor {name} missing")
        if shapes[name] != shape:
            raise HFModelError(f"{where[name]}: {name} has shape {list(shapes[name])}, config.json gives {list(shape)}")
    optional = {"lm_head.weight"} if flavour.tie_embeddings else set()
    for name in sorted(set(shapes) - set(expected) - optional):
        if not name.endswith(IGNORED_SUFFIXES):
            raise HFModelError(f"{where[name]}: tensor {name} is not part of the model (not supported)")
