"""`copus export`: a run's newest committed checkpoint as a Hugging Face model directory.

The checkpoint may come from any layout: DCP keys tensors by parameter name and reassembles
tensor-parallel shards and pipeline stages on load. Tensors are read from it a group at a time
(one output shard's worth), converted to Hugging Face's names and rotary layout, and written as
safetensors shards with an index, so memory holds one shard, never the whole model. The
directory is written beside OUT and renamed into place once complete.

The run's output directory may be on an object store (copus.storage): the checkpoint is then
downloaded first. OUT may be one too: the model is written locally, then uploaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

from copus.storage import RAY_RUN_NAME, Location, StorageError, first_line, ray_storage
from copus.train.checkpoint import CheckpointError, checkpoint_dirs, newest_complete, read_trainer_state
from workloads.flavours import ModelFlavour
from workloads.hf_config import INDEX, SINGLE_FILE, config_from_flavour
from workloads.registry import HFWeights, model_spec

MAX_SHARD_BYTES = 2 << 30


class ExportError(ValueError):
    """One line naming the directory or file that cannot be exported."""


def committed_checkpoint(
    output_dir: Location, stack: contextlib.ExitStack
) -> tuple[Path, Location, list[tuple[object, str]]]:
    """The run's newest complete checkpoint: a local directory with its files (a download for
    an object store) that stays until `stack` closes, where it is, and the newer checkpoints
    refused before it with the reason."""
    root = ray_storage(output_dir) / RAY_RUN_NAME
    candidates = checkpoint_dirs(root)
    found, refused = newest_complete(candidates, stack)
    if found is None:
        why = f" ({len(refused)} refused: {refused[0][1]})" if refused else ""
        raise ExportError(f"{output_dir}: no committed checkpoint under {root}{why}")
    return found, candidates[len(refused)], refused


def check_target(target: Location) -> None:
    """OUT must be absent or an empty directory, and (locally) creatable: refused before the
    checkpoint is read, which for a large model takes a while."""
    if target.exists() and (not target.is_dir() or target.iterdir()):
        raise ExportError(f"{target}: exists and is not an empty directory")
    if not target.is_local:
        return
    ancestor = target.local_path()
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ExportError(f"{target}: cannot be created: {ancestor} is a file, not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ExportError(f"{target}: cannot be created: {ancestor} is not writable")


@contextlib.contextmanager
def _dcp_reading(checkpoint: Path):
    """DCP's reader fails in many ways on files that are not what their manifest promised (an
    unpickling error, a CheckpointException, an EOFError): each is one line naming the checkpoint."""
    try:
        yield
    except OSError:
        raise
    except Exception as err:
        raise ExportError(
            f"{checkpoint}: the DCP files cannot be read ({type(err).__name__}: {first_line(err)})"
        ) from None


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
    with _dcp_reading(checkpoint):
        tensors = _model_tensors(checkpoint)
    if flavour.tie_embeddings:
        tensors.pop("output.weight", None)  # transformers ties lm_head to the embedding
    groups = _groups(tensors, max_bytes)
    weight_map: dict[str, str] = {}
    for i, group in enumerate(groups, start=1):
        state = {"model": {name: torch.empty(tensors[name][0], dtype=tensors[name][1]) for name in group}}
        with warnings.catch_warnings(), _dcp_reading(checkpoint):  # "assuming the intent is to load in a
            warnings.simplefilter("ignore", UserWarning)  # single process": it is
            dcp.load(state, checkpoint_id=str(checkpoint), no_dist=True)
        file = SINGLE_FILE if len(groups) == 1 else f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        hf = _hf_weights(flavour).to_hf(state["model"], flavour)
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
    try:
        source, target = Location.parse(output_dir), Location.parse(out)
        check_target(target)
        with contextlib.ExitStack() as stack:
            checkpoint, where, refused = committed_checkpoint(source, stack)
            trainer_state, flavour = _checkpoint_model(checkpoint)
            if target.is_local:
                weight_map = _write_model_dir(checkpoint, flavour, target.local_path(), max_shard_bytes)
            else:
                local = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="copus-export-"))) / target.name
                weight_map = _write_model_dir(checkpoint, flavour, local, max_shard_bytes)
                target.upload_from(local)
    except StorageError as err:  # a path that cannot name a file, a store that does not answer
        raise ExportError(str(err)) from None
    return {
        "checkpoint": str(where),
        "out": str(target),
        "tensors": len(weight_map),
        "files": len(set(weight_map.values())),
        "step": trainer_state.get("step"),
        "refused": [{"checkpoint": str(c), "reason": why} for c, why in refused],
    }


def _checkpoint_model(checkpoint: Path) -> tuple[dict, ModelFlavour]:
    """The checkpoint's trainer state and the model shape it records."""
    try:
        trainer_state = read_trainer_state(checkpoint)
    except (FileNotFoundError, CheckpointError) as err:
        raise ExportError(str(err)) from None
    shape = trainer_state.get("model_shape")
    if shape is None:
        raise ExportError(
            f"{checkpoint}: the checkpoint does not record the model's shape (written before copus "
            f"export existed); train on from it once and export the new checkpoint"
        )
    try:
        return trainer_state, ModelFlavour.from_dict(shape)
    except (TypeError, ValueError, AttributeError) as err:
        raise ExportError(f"{checkpoint}: model_shape in its trainer state is damaged ({err})") from None


def _write_model_dir(checkpoint: Path, flavour: ModelFlavour, out: Path, max_shard_bytes: int) -> dict[str, str]:
    """The model directory, written beside `out` and renamed into place once complete."""
    staging = out.with_name(f".{out.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir(parents=True)
        weight_map = _write_shards(checkpoint, flavour, staging, max_shard_bytes)
        (staging / "config.json").write_text(json.dumps(config_from_flavour(flavour), indent=2))
        if out.exists():
            out.rmdir()
        os.replace(staging, out)
    except OSError as err:  # a full disk, a read-only or special filesystem
        shutil.rmtree(staging, ignore_errors=True)
        raise ExportError(f"{out}: cannot be written ({err.strerror or err})") from None
    return weight_map


def _hf_weights(flavour: ModelFlavour) -> HFWeights:
    """How the checkpoint's model family writes Hugging Face tensors."""
    hf = model_spec(flavour.family).hf
    if hf is None:
        raise ExportError(f"the {flavour.family!r} model family has no Hugging Face export")
    return hf
