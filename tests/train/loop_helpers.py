"""Helpers to run the training loop (or any per-rank function) in-process or on N gloo
processes, without Ray."""

from __future__ import annotations

from pathlib import Path

from copus.core.layout import CandidateConfig
from copus.core.schedule import LRSchedule
from copus.train.local import run_local, run_on_gloo_ranks
from copus.train.plan import StopRule, WorkerPlan
from workloads.corpus import prepare_dataset


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
    ranks = spawn(world, _train, plan, ckpt_root, resume_step, shapes)
    params: dict = {}
    for _, _, rank_params in ranks:  # pipeline stages each hold their own layers
        params.update(rank_params)
    return ranks[0][0], ranks[0][1], params


def losses(records: list[dict], kind: str = "step", key: str = "train_loss") -> dict[int, float]:
    return {r["step"]: r[key] for r in records if r["kind"] == kind}
