"""Checkpoints with torch.distributed.checkpoint (DCP).

A checkpoint directory holds:
  .metadata, __<rank>_0.distcp   model and optimiser state (DCP; keyed by parameter name,
                                 so it can be loaded into another layout)
  trainer_state.json             step, samples, data position, target bookkeeping (rank 0)
  rng_rank<r>.pt                 each rank's RNG state

Each rank may write into its own local directory: the file names never collide, and Ray
Train merges the directories of all ranks into one checkpoint in storage.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

TRAINER_STATE = "trainer_state.json"
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


def save_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    trainer_state: dict, rank: int) -> None:
    """Collective: every rank calls it with the same trainer_state."""
    path.mkdir(parents=True, exist_ok=True)
    dcp.save(layout_free_state(model, optimizer), checkpoint_id=str(path))
    torch.save(_rng_state(), path / f"rng_rank{rank}.pt")
    if rank == 0:
        tmp = path / f".{TRAINER_STATE}.tmp"
        tmp.write_text(json.dumps(trainer_state, indent=2))
        os.replace(tmp, path / TRAINER_STATE)


def read_trainer_state(path: Path) -> dict:
    state_file = path / TRAINER_STATE
    if not state_file.is_file():
        raise FileNotFoundError(f"{path}: not a COPUS checkpoint ({TRAINER_STATE} missing)")
    return json.loads(state_file.read_text())


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
