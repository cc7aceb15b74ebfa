"""Helpers to run the training loop (or any per-rank function) in-process or on N gloo
processes, without Ray."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from copus.core.layout import CandidateConfig
from copus.core.schedule import LRSchedule
from copus.train.local import run_local, run_on_gloo_ranks
from copus.train.worker_plan import StopRule, WorkerPlan
from workloads.datasets import prepare_dataset


def small_plan(cache_dir: Path, **changes) -> WorkerPlan:
    files = prepare_dataset("stdlib", None, None, "text", "uint16", 0.01, 256, str(cache_dir))
    plan = WorkerPlan(
        model="debug",
        seq_len=32,
        seed=7,
        train_tokens=str(files.train),
        val_tokens=str(files.val),
        token_dtype=files.dtype,
        config=CandidateConfig(dp=1, tp=1, pp=1, mbs=2, gbs=8),
        lr=LRSchedule(3e-3, 8, warmup_samples=16),
        stop=StopRule(max_steps=6),
        eval_every_steps=3,
        val_samples=8,
        checkpoint_every_steps=3,
    )
    return plan.replaced(**changes)


def shapes_hook(shapes: dict[int, tuple[int, int]] | None):
    """A batch_size hook that follows {step: (gbs, mbs)} (picklable for spawned ranks)."""
    if shapes is None:
        return None
    return lambda step, samples, gbs, mbs: shapes.get(step, (gbs, mbs))


spawn = run_on_gloo_ranks  # fn(*args) on N gloo ranks, every rank's result


def _train(plan: WorkerPlan, ckpt_root: Path, resume_step: int | None, shapes: dict | None):
    return run_local(plan, ckpt_root, resume_step, shapes_hook(shapes))


def _train_each(runs: list[tuple]) -> list:
    return [_train(*run) for run in runs]


def run_distributed_each(world: int, runs: list[tuple]) -> list[tuple[list[dict], dict, dict]]:
    """Several trainings, each (plan, checkpoint root, resume step or None, shapes or None),
    one after another on the same `world` gloo processes (or in this process when world is
    1): starting 8 ranks on 2 cores costs more than a few steps of the debug model, so tests
    batch the runs of one world size. Each run builds its model, data and optimizer from its
    plan and checkpoint. Returns, per run, rank 0's records and final state and the full
    parameters gathered from every stage."""
    ranks = spawn(world, _train_each, runs)
    out = []
    for i in range(len(runs)):
        params: dict = {}
        for rank in ranks:  # pipeline stages each hold their own layers
            params.update(rank[i][2])
        out.append((ranks[0][i][0], ranks[0][i][1], params))
    return out


def run_distributed(
    world: int,
    plan: WorkerPlan,
    tmp: Path,
    ckpt_root: Path,
    resume_step: int | None = None,
    shapes: dict[int, tuple[int, int]] | None = None,
) -> tuple[list[dict], dict, dict]:
    """Train on `world` gloo processes (or this process alone when world is 1). Returns rank
    0's records and final state, and the full parameters gathered from every stage."""
    return run_distributed_each(world, [(plan, ckpt_root, resume_step, shapes)])[0]


class RunsByWorld:
    """Runs keyed by what they are for, started on demand a group at a time: the runs of one
    world size share one set of gloo processes (one spawn; starting 8 ranks on 2 cores costs
    more than a few steps of the debug model). A run that resumes another's checkpoint never
    shares that run's processes: from another world size it joins its own world's group, from
    the same world size it runs in a later group (world 1 runs in this process: no spawn to
    save). `execute(world, runs)` runs a group, one after another, and returns their results."""

    def __init__(self, execute: Callable[[int, list], list]):
        self.execute = execute
        self.runs: dict = {}  # key -> (world, run)
        self.source: dict = {}  # key of a resume -> key of the run that wrote its checkpoint
        self.results: dict = {}

    def add(self, key, world: int, run, source=None) -> None:
        self.runs[key] = (world, run)
        if source is not None:
            self.source[key] = source

    def _group(self, key) -> tuple[int, str]:
        world = self.runs[key][0]
        if key not in self.source:
            return world, "fresh"
        moved = world != self.runs[self.source[key]][0]
        return world, "fresh" if moved and world > 1 else "resume"

    def __getitem__(self, key):
        if key not in self.results:
            group = self._group(key)
            members = [k for k in self.runs if self._group(k) == group]
            for source in [self.source[k] for k in members if k in self.source]:
                self.__getitem__(source)  # its checkpoint first
            self.results.update(zip(members, self.execute(group[0], [self.runs[k][1] for k in members])))
        return self.results[key]


def losses(records: list[dict], kind: str = "step", key: str = "train_loss") -> dict[int, float]:
    return {r["step"]: r[key] for r in records if r["kind"] == kind}
