"""Checkpoints with torch.distributed.checkpoint (DCP), committed in three stages.

A checkpoint directory holds:
  .metadata, __<rank>_0.distcp   model and optimiser state (DCP; keyed by parameter name,
                                 so it can be loaded into another layout)
  rng_rank<r>.pt                 each rank's RNG state
  manifest_rank<r>.json          each rank's files with their sizes and SHA-256
  trainer_state.json             step, samples, data position, target bookkeeping (rank 0)
  COMPLETE                       written by rank 0 last, once every rank has re-read and
                                 verified its files against its manifest

Written, verified, then marked complete: a directory without COMPLETE, or whose files do not
match the manifests (a crash mid-write, a torn upload, a corrupted disk), is refused on resume
with the reason, and the newest complete checkpoint before it is used (`newest_complete`).

Each rank may write into its own local directory: the file names never collide, and Ray
Train merges the directories of all ranks into one checkpoint in storage. Storage may be an
object store (copus.storage): a checkpoint is verified and loaded from a local copy, which Ray
downloads once per node.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path
from typing import Callable, ContextManager

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from copus.parallel.agree import all_ranks_ok
from copus.storage import Location, local_copy
from workloads.corpus import file_digest

TRAINER_STATE = "trainer_state.json"
COMPLETE = "COMPLETE"
MANIFEST = "manifest_rank{rank}.json"
# Optimiser state keyed per parameter name ("state.layers.0.attention.wq.weight.exp_avg"),
# not by position in this rank's param groups: what lets another layout load it.
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def _rng_state() -> dict:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def layout_free_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """{"model": ..., "optim": ...}: this rank's model and optimiser state keyed by parameter
    name (DTensor shards under tensor parallelism). An optimiser without state yet gets it
    initialised first, so the keys are the same before and after the first step."""
    model_sd, optim_sd = get_state_dict(model, optimizer, options=_OPTIONS)
    return {"model": model_sd, "optim": optim_sd}


def apply_layout_free_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=_OPTIONS)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def _manifest_problems(path: Path, manifest: dict) -> list[str]:
    problems = []
    for name, entry in manifest["files"].items():
        f = path / name
        if not f.is_file():
            problems.append(f"{name} missing")
        elif f.stat().st_size != entry["size"]:
            problems.append(f"{name} has {f.stat().st_size} bytes, {entry['size']} written")
        elif file_digest(f) != entry["sha256"]:
            problems.append(f"{name} does not match its SHA-256")
    return problems


_PEER_FILE = re.compile(r"__(\d+)_.*|rng_rank(\d+)\.pt")


def _a_peers(name: str, rank: int) -> bool:
    """Whether `name` is a file another rank writes in save_checkpoint: DCP names rank r's shard
    files `__r_<i>.distcp`, the coordinator (rank 0) writes `.metadata`, rank 0 the trainer
    state, and every rank its `rng_rank<r>.pt`. Ranks that share the directory (a shared
    filesystem; Ray Train gives each its own) see their peers' files appear, possibly half
    written, between their own writes: a rank's manifest lists only its own."""
    if rank != 0 and name in (".metadata", TRAINER_STATE):
        return True
    owner = _PEER_FILE.fullmatch(name)
    return owner is not None and int(owner.group(1) or owner.group(2)) != rank


def save_checkpoint(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainer_state: dict, rank: int
) -> None:
    """Collective: every rank calls it with the same trainer_state, each with a directory of
    its own (Ray Train merges them in storage) or all with one shared directory."""
    path.mkdir(parents=True, exist_ok=True)
    before = set(path.iterdir())
    dcp.save(layout_free_state(model, optimizer), checkpoint_id=str(path))
    torch.save(_rng_state(), path / f"rng_rank{rank}.pt")
    if rank == 0:
        _write_json(path / TRAINER_STATE, trainer_state)
    new = set(path.iterdir()) - before
    mine = sorted(p for p in new if p.is_file() and not p.name.endswith(".tmp") and not _a_peers(p.name, rank))
    manifest = {
        "rank": rank,
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "files": {p.name: {"size": p.stat().st_size, "sha256": file_digest(p)} for p in mine},
    }
    _write_json(path / MANIFEST.format(rank=rank), manifest)
    verified = not _manifest_problems(path, manifest)  # re-read what was written
    device = next(model.parameters()).device
    if all_ranks_ok(verified, device) and rank == 0:
        _write_json(path / COMPLETE, {"step": trainer_state.get("step"), "world_size": manifest["world_size"]})
    if not verified:
        raise CheckpointError(f"{path}: rank {rank}'s checkpoint files did not verify after writing")


class CheckpointError(RuntimeError):
    pass


# Any of these from reading a marker or manifest means it is damaged (torn, truncated, not ours).
_DAMAGED = (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError)
MAX_WORLD = 1 << 20  # more ranks than any cluster: a COMPLETE marker saying more is damaged


def checkpoint_problems(path: Path) -> list[str]:
    """Why `path` is not a complete checkpoint (empty when it is). A marker or manifest that
    cannot be read is a problem like a file that does not match: the checkpoint is refused."""
    if not (path / COMPLETE).is_file():
        return [f"not marked {COMPLETE} (a write that did not finish)"]
    try:
        world = json.loads((path / COMPLETE).read_text())["world_size"]
    except _DAMAGED as err:
        return [f"{COMPLETE} is damaged ({type(err).__name__})"]
    if not isinstance(world, int) or not 1 <= world <= MAX_WORLD:
        return [f"{COMPLETE} is damaged (world_size {world!r})"]
    problems = []
    for rank in range(world):
        m = path / MANIFEST.format(rank=rank)
        if not m.is_file():
            problems.append(f"{m.name} missing")
            continue
        try:
            problems += _manifest_problems(path, json.loads(m.read_text()))
        except _DAMAGED as err:
            problems.append(f"{m.name} is damaged ({type(err).__name__})")
    return problems


def newest_complete(
    candidates: list,
    stack: contextlib.ExitStack,
    materialise: Callable[[Location], ContextManager] = local_copy,
) -> tuple[Path | None, list[tuple[object, str]]]:
    """The first complete checkpoint of `candidates` (paths or Locations, newest first) as a
    local directory that stays available until `stack` closes, and the candidates refused
    before it with their reasons. `materialise` makes a candidate local (a download for an
    object store; Ray's node-shared `Checkpoint.as_directory` in workers)."""
    refused = []
    for candidate in candidates:
        with contextlib.ExitStack() as attempt:
            local = Path(attempt.enter_context(materialise(Location.parse(candidate))))
            problems = checkpoint_problems(local)
            if not problems:
                stack.enter_context(attempt.pop_all())  # keep this copy until the caller is done
                return local, refused
        refused.append((candidate, "; ".join(problems)))
    return None, refused


def read_trainer_state(path: Path) -> dict:
    state_file = path / TRAINER_STATE
    if not state_file.is_file():
        raise FileNotFoundError(f"{path}: not a COPUS checkpoint ({TRAINER_STATE} missing)")
    try:
        state = json.loads(state_file.read_text())
    except (UnicodeDecodeError, ValueError) as err:
        raise CheckpointError(f"{state_file}: not readable JSON ({err})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{state_file}: expected a JSON object")
    return state


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int) -> dict:
    """Collective: load model and optimiser state in place, return the trainer state."""
    trainer_state = read_trainer_state(path)
    state = layout_free_state(model, optimizer)
    dcp.load(state, checkpoint_id=str(path))
    apply_layout_free_state(model, optimizer, state)
    rng_file = path / f"rng_rank{rank}.pt"
    if rng_file.is_file():  # absent when the checkpoint came from a smaller world
        rng = torch.load(rng_file, weights_only=False)
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
    return trainer_state


def checkpoint_dirs(root: Location) -> list[Location]:
    """The checkpoints Ray Train keeps in a run's storage (named checkpoint_<timestamp>), newest first."""
    return [c for c in reversed(root.iterdir()) if c.name.startswith("checkpoint_") and c.is_dir()]


def resume_candidates(latest: Location | None, root: Location | None) -> list[Location]:
    """Where to look for a checkpoint to resume from, newest first: every checkpoint in the run's
    storage (`root`), with the one Ray Train hands over (`latest`) among them. A newer one than
    Ray's counts: Ray Train registers a checkpoint only once its controller has collected every
    rank's report (it polls every 2 s), so a node lost or a link cut just after a save leaves
    that checkpoint written but unknown to Ray, and a restart would redo its steps. Only a
    complete one is taken (`newest_complete`), and --fresh empties the storage, so all in it are
    this run's."""
    stored = checkpoint_dirs(root) if root is not None else []
    if latest is not None and latest.name not in {c.name for c in stored}:
        stored.append(latest)
    return sorted(stored, key=lambda c: c.name, reverse=True)
