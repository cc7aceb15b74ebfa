"""Sharded data parallelism (FSDP2: dp_shard optimizer and full), overlapped gradient
all-reduce (dp_shard none) and activation recomputation train the same model to the same
numbers as one process (gloo, CPU, fp32), composed with tensor and pipeline parallelism; the
GNS probe measures the same norms under every mode; in-place changes move the state from a
sharded layout to an unsharded one and back.

The ranks run the engine (ParallelModel) directly, steps on seeded random tokens, so every
case trains on exactly the reference's batches."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from copus.core.layout import CandidateConfig
from copus.parallel.dims import ParallelDims
from copus.parallel.gns_probe import GradNormProbe
from copus.train.checkpoint import load_checkpoint, save_checkpoint
from copus.train.parallel_model import ParallelModel
from copus.train.reshard_in_place import reshard_in_place
from tests.train.loop_helpers import RunsByWorld, small_plan, spawn

pytestmark = pytest.mark.slow

GBS, MBS, STEPS = 8, 2, 3
BUCKET_BYTES = 16 << 10  # small buckets: the debug model's gradients fill several


def adamw(model: ParallelModel) -> torch.optim.Optimizer:
    """The loop's AdamW (decay on matrices only)."""
    decay = [p for p in model.params if p.ndim >= 2]
    no_decay = [p for p in model.params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=3e-3, betas=(0.9, 0.95), foreach=False)


def build(plan, cfg: CandidateConfig) -> ParallelModel:
    dims = ParallelDims(cfg.dp, cfg.tp, cfg.pp)
    return ParallelModel(
        plan.flavour,
        plan.seq_len,
        plan.seed,
        dims,
        torch.device("cpu"),
        plan.pp_schedule,
        dp_shard=cfg.dp_shard,
        recompute=cfg.recompute,
        grad_bucket_bytes=BUCKET_BYTES,
    )


def step(model: ParallelModel, optimizer, plan, step_index: int) -> dict:
    """One step on the global batch of `step_index` (at the plan's warmed-up learning rate, as the
    loop); this replica takes its contiguous block."""
    for group in optimizer.param_groups:
        group["lr"] = plan.lr.lr(step_index * GBS, GBS)
    shape = (GBS, plan.seq_len + 1)
    tokens = torch.randint(0, plan.flavour.vocab_size, shape, generator=torch.Generator().manual_seed(100 + step_index))
    per = GBS // model.dims.dp
    mine = tokens[model.dp_rank * per : (model.dp_rank + 1) * per]
    loss = model.forward_backward(mine[:, :-1], mine[:, 1:], MBS).mean()
    if model.dims.dp > 1:
        dist.all_reduce(loss, group=model.dp_group)
        loss /= model.dims.dp
    norm = model.reduce_and_clip(1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    overlapped = model.reducer.launched_in_backward if model.reducer is not None else 0
    return {"loss": float(loss), "norm": norm, "gns": model.last_norms, "overlapped": overlapped}


def full_params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone() for n, p in module.named_parameters()
    }


def train(
    plan, configs: dict[int, CandidateConfig], steps: int = STEPS, start: int = 0, ckpt: Path | None = None
) -> dict:
    """On every rank: take steps start..steps-1 starting in configs[start], changing in place to
    configs[k] before step k; with `ckpt`, first load it when start > 0, and save into it (each
    rank its own directory, as under Ray Train) after the last step when start = 0. Returns each
    step's figures and the final parameters (this rank's stage)."""
    model = build(plan, configs[start])
    optimizer = adamw(model)
    rank = dist.get_rank() if dist.is_initialized() else 0
    if ckpt is not None and start:
        load_checkpoint(ckpt, model.module, optimizer, rank)
    if model.dims.dp > 1:
        model.attach_probe()
    records = []
    for k in range(start, steps):
        if k > start and k in configs:
            model, optimizer, _ = reshard_in_place(model, optimizer, plan, configs[k], adamw)
            if model.dims.dp > 1:
                model.attach_probe()
        records.append(step(model, optimizer, plan, k))
    if ckpt is not None and not start:
        save_checkpoint(ckpt / f"rank{rank}", model.module, optimizer, {"step": steps}, rank)
    params = full_params(model.module)
    model.close()
    return {"records": records, "params": params}


def train_each(plan, jobs: list[tuple]) -> list[dict]:
    return [train(plan, *job) for job in jobs]


def run_each(plan, world: int, jobs: list[tuple]) -> list[tuple[list[dict], dict]]:
    """Jobs (configs, steps, start, ckpt) one after another on one set of `world` ranks; each
    job's rank 0 records and full parameters. A job that loads a checkpoint first gets the
    rank directories its saving job wrote (in ckpt's sibling `ranks`) merged into ckpt, as Ray
    Train does in storage."""
    for _, _, start, ckpt in jobs:
        if start and not ckpt.exists():
            for rank_dir in sorted((ckpt.parent / "ranks").iterdir()):
                shutil.copytree(rank_dir, ckpt, dirs_exist_ok=True)
    ranks = spawn(world, train_each, plan, jobs)
    out = []
    for i in range(len(jobs)):
        params: dict = {}
        for r in ranks:  # pipeline stages each hold their own layers
            params.update(r[i]["params"])
        out.append((ranks[0][i]["records"], params))
    return out


def cfg(dp=1, tp=1, pp=1, dp_shard="none", recompute="none") -> CandidateConfig:
    return CandidateConfig(dp, tp, pp, MBS, GBS, dp_shard, recompute)


@pytest.fixture(scope="module")
def plan(token_cache):
    return small_plan(token_cache)


SHARDED = [cfg(dp=2, dp_shard="full"), cfg(dp=2, dp_shard="optimizer")]
COMPOSED = [
    cfg(dp=2, tp=2, dp_shard="full", recompute="selective"),
    cfg(dp=2, pp=2, dp_shard="optimizer", recompute="full"),
    cfg(dp=2, pp=2, dp_shard="full"),
]
IN_PLACE = {
    0: cfg(dp=2, dp_shard="full"),
    1: cfg(tp=2),  # sharded -> unsharded (and tensor-parallel)
    2: cfg(dp=2, dp_shard="optimizer", recompute="selective"),  # and back
}
CHECKPOINTS = [(cfg(dp=2, dp_shard="full"), cfg()), (cfg(), cfg(dp=2, dp_shard="optimizer"))]


@pytest.fixture(scope="module")
def runs(plan, tmp_path_factory) -> RunsByWorld:
    """Every run of this module, by what it is for, started a world size at a time."""
    runs = RunsByWorld(lambda world, jobs: run_each(plan, world, jobs))

    def add(key, configs, steps=STEPS, start=0, ckpt=None, source=None):
        runs.add(key, configs[start].world_size, (configs, steps, start, ckpt), source)

    add("reference", {0: cfg()})  # one process, no process group
    add("dp2", {0: cfg(dp=2)})  # dp = 2 unsharded, the overlapped all-reduce: the GNS probe's numbers to match
    for config in SHARDED + COMPOSED:
        add(config, {0: config})
    add("selective", {0: cfg(recompute="selective")})
    add("in-place", IN_PLACE)
    for i, (saved, loaded) in enumerate(CHECKPOINTS):
        root = tmp_path_factory.mktemp("checkpoint")
        add(("saved", i), {0: saved}, steps=STEPS - 1, ckpt=root / "ranks")
        add(("loaded", i), {STEPS - 1: loaded}, start=STEPS - 1, ckpt=root / "ckpt", source=("saved", i))
    return runs


@pytest.fixture(scope="module")
def reference(runs):
    return runs["reference"]


@pytest.fixture(scope="module")
def dp2_unsharded(runs):
    return runs["dp2"]


def assert_matches(reference, records, params, start: int = 0) -> None:
    ref_records, ref_params = reference
    for k in range(start, STEPS):
        assert records[k - start]["loss"] == pytest.approx(ref_records[k]["loss"], rel=1e-4), k
        assert records[k - start]["norm"] == pytest.approx(ref_records[k]["norm"], rel=1e-4), k
    assert set(params) == set(ref_params)
    for name, value in ref_params.items():
        torch.testing.assert_close(params[name], value, rtol=1e-3, atol=1e-6, msg=name)


def assert_same_gns(records, baseline) -> None:
    for got, want in zip(records, baseline):
        assert got["gns"].b_small == want["gns"].b_small and got["gns"].b_big == want["gns"].b_big
        assert got["gns"].sq_small == pytest.approx(want["gns"].sq_small, rel=1e-4)
        assert got["gns"].sq_big == pytest.approx(want["gns"].sq_big, rel=1e-4)


def test_overlapped_all_reduce_matches_one_process_and_overlaps_backward(reference, dp2_unsharded):
    records, params = dp2_unsharded
    assert_matches(reference, records, params)
    assert all(r["overlapped"] >= 2 for r in records)  # buckets all-reduced while backward ran


@pytest.mark.parametrize("config", SHARDED, ids=lambda c: c.dp_shard)
def test_sharded_data_parallel_matches_one_process_with_the_same_gns(runs, reference, dp2_unsharded, config):
    records, params = runs[config]
    assert_matches(reference, records, params)
    assert_same_gns(records, dp2_unsharded[0])


@pytest.mark.parametrize("config", COMPOSED, ids=lambda c: c.label().replace(" ", "-"))
def test_sharding_composes_with_tensor_and_pipeline_parallelism(runs, reference, dp2_unsharded, config):
    records, params = runs[config]
    assert_matches(reference, records, params)
    assert_same_gns(records, dp2_unsharded[0])


def test_selective_recomputation_changes_no_number(runs, reference):
    """One process (full recomputation runs in the pipeline case above)."""
    records, params = runs["selective"]
    assert_matches(reference, records, params)


def test_in_place_changes_move_sharded_state_to_unsharded_layouts_and_back(runs, reference):
    records, params = runs["in-place"]
    assert_matches(reference, records, params)


@pytest.mark.parametrize("case", range(len(CHECKPOINTS)), ids=["full-to-one-process", "one-process-to-optimizer"])
def test_a_checkpoint_loads_across_sharding_modes(runs, reference, case):
    records, params = runs[("loaded", case)]
    assert_matches(reference, records, params, start=STEPS - 1)  # model and AdamW state both moved


def test_adam_preconditioned_gns_under_sharding_is_refused_by_name():
    with pytest.raises(ValueError, match=r"gns.precondition: 'adam' .* parallel.dp_shard"):
        GradNormProbe([], 0, [], None, 2, precondition=lambda p: None, replica_params=[])
