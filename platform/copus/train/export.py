"""`copus export`: a run's newest committed checkpoint as a Hugging Face model directory.

The checkpoint may come from any layout: DCP keys tensors by parameter name and reassembles
tensor-parallel shards and pipeline stages on load. Tensors are read from it a group at a time
(one output shard's worth), converted to Hugging Face's names and rotary layout, and written as
safetensors shards with an index, so memory holds one shard, never the whole model. The
directory is written beside OUT and renamed into place once complete.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

from copus.storage import RAY_RUN_NAME, ray_storage
from copus.train.checkpoint import newest_complete, read_trainer_state
from workloads.flavours import ModelFlavour
from workloads.hf_config import INDEX, SINGLE_FILE, config_from_flavour
from workloads.hf_weights import to_hf_tensors

MAX_SHARD_BYTES = 2 << 30


class ExportError(ValueError):
    """One line naming the directory or file that cannot be exported."""


def committed_checkpoint(output_dir: Path) -> Path:
    root = ray_storage(output_dir) / RAY_RUN_NAME
    candidates = sorted((p for p in root.glob("checkpoint_*") if p.is_dir()), reverse=True) if root.is_dir() else []
    found, refused = newest_complete(candidates)
    if found is None:
        why = f" ({len(refused)} refused: {refused[0][1]})" if refused else ""
        raise ExportError(f"{output_dir}: no committed checkpoint under {root}{why}")
    return found


def _model_tensors(checkpoint: Path) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """Our parameter name -> (shape, dtype) of every model tensor the checkpoint holds."""
    metadata = dcp.FileSystemReader(str(checkpoint)).read_metadata().state_dict_metadata
    return {
        key[len("model.") :]: (meta.size, meta.properties.dtype)
        for key, meta in metadata.items()
        if key.startswith("model.")
    }


def _groups(tensors: dict[str, tuple[torch.Size, torch.dtype]], max_bytes: int) -> list[list[str]]:
    groups: list[list[str]] = [[]]
    size = 0
    for name, (shape, dtype) in tensors.items():
        nbytes = shape.numel() * dtype.itemsize
        if groups[-1] and size + nbytes > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    return groups


def _write_shards(checkpoint: Path, flavour: ModelFlavour, staging: Path, max_bytes: int) -> dict[str, str]:
    """Write the model tensors as safetensors shards; returns Hugging Face name -> file."""
    tensors = _model_tensors(checkpoint)
    if flavour.tie_embeddings:
        tensors.pop("output.weight", None)  # transformers ties lm_head to the embedding
    groups = _groups(tensors, max_bytes)
    weight_map: dict[str, str] = {}
    for i, group in enumerate(groups, start=1):
        state = {"model": {name: torch.empty(tensors[name][0], dtype=tensors[name][1]) for name in group}}
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(state, checkpoint_id=str(checkpoint), no_dist=True)
        file = SINGLE_FILE if len(groups) == 1 else f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        hf = to_hf_tensors(state["model"], flavour.head_dim, flavour.tie_embeddings)
        save_file(hf, str(staging / file), metadata={"format": "pt"})
        weight_map.update({name: file for name in hf})
    if len(groups) > 1:
        total = sum(s.numel() * d.itemsize for s, d in tensors.values())
        (staging / INDEX).write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
        )
    return weight_map


def export_run(output_dir: str | Path, out: str | Path, max_shard_bytes: int = MAX_SHARD_BYTES) -> dict:
    """Write the newest committed checkpoint of the run in `output_dir` to `out` as a Hugging
    Face model directory. Returns what was written."""
    output_dir, out = Path(output_dir).expanduser().resolve(), Path(out).expanduser().resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out}: exists and is not an empty directory")
    checkpoint = committed_checkpoint(output_dir)
    shape = read_trainer_state(checkpoint).get("model_shape")
    if shape is None:
        raise ExportError(
            f"{checkpoint}: the checkpoint does not record the model's shape (written before copus "
            f"export existed); train on from it once and export the new checkpoint"
        )
    flavour = ModelFlavour.from_dict(shape)
    staging = out.with_name(f".{out.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    weight_map = _write_shards(checkpoint, flavour, staging, max_shard_bytes)
    (staging / "config.json").write_text(json.dumps(config_from_flavour(flavour), indent=2))
    if out.exists():
        out.rmdir()
    os.replace(staging, out)
    return {
        "checkpoint": str(checkpoint),
        "out": str(out),
        "tensors": len(weight_map),
        "files": len(set(weight_map.values())),
        "step": read_trainer_state(checkpoint).get("step"),
    }
