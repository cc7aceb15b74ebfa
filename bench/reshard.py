"""Why the in-place path moves state point to point: on the same gloo ranks and layout changes,
the in-place reshard (`copus.train.reshard_in_place`: new mesh, slices sent rank to rank) against
going through DCP on local disk without a process restart (every rank saves, builds the new
layout, loads: what checkpoint-and-restart does minus the restart itself).

    .venv/bin/python bench/reshard.py                  # the small model on 4 and 8 ranks, about 2 minutes
    .venv/bin/python bench/reshard.py --model tiny --workers 8
    .venv/bin/python bench/reshard.py --smoke          # the debug model on 4 ranks, one round

The last line reads `N ranks: in place X s (... MiB moved between ranks), through DCP on disk Y s: Zx`
for the last world size.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from smoke import parse_args

from copus.core.layout import CandidateConfig
from copus.core.schedule import LRSchedule
from copus.parallel.dims import ParallelDims
from copus.train.checkpoint import load_checkpoint, save_checkpoint
from copus.train.host import release_memory
from copus.train.local import run_on_gloo_ranks
from copus.train.parallel_model import ParallelModel
from copus.train.replica import make_optimizer, train_step
from copus.train.reshard_in_place import reshard_in_place
from copus.train.worker_plan import OptimizerPlan, WorkerPlan
from workloads.flavours import FLAVOURS

CYCLES = {4: [(4, 1, 1), (2, 1, 2), (1, 2, 2), (2, 2, 1)], 8: [(8, 1, 1), (2, 2, 2), (2, 1, 4), (4, 2, 1)]}


def _build(model_name: str, layout, seq: int) -> tuple[ParallelModel, torch.optim.Optimizer]:
    model = ParallelModel(FLAVOURS[model_name], seq, 0, ParallelDims(*layout), torch.device("cpu"))
    return model, make_optimizer(model, OptimizerPlan(), 1e-3)


def _step(model, optimizer, seq: int, gbs: int = 16, mbs: int = 2) -> None:
    n = gbs // model.dims.dp
    x = torch.randint(0, 256, (n, seq), generator=torch.Generator().manual_seed(model.dp_rank))
    train_step(model, optimizer, x, torch.roll(x, -1, 1), mbs, 1e-3, 1.0)


def _measure(model_name: str, world: int, rounds: int, root: str) -> dict:
    seq = 64
    cycle = CYCLES[world]
    plan = WorkerPlan(
        model=model_name,
        seq_len=seq,
        seed=0,
        train_tokens="",
        val_tokens="",
        token_dtype="uint16",
        config=CandidateConfig(*cycle[0], mbs=2, gbs=16),
        lr=LRSchedule(1e-3, 16),
    )
    model, optimizer = _build(model_name, cycle[0], seq)
    _step(model, optimizer, seq)
    in_place, via_disk, moved = [], [], []
    for i in range(rounds * len(cycle)):
        target = cycle[(i + 1) % len(cycle)]
        # In place: slices sent between ranks.
        dist.barrier()
        t = time.perf_counter()
        model, optimizer, stats = reshard_in_place(
            model, optimizer, plan, CandidateConfig(*target, 2, 16), lambda m: make_optimizer(m, OptimizerPlan(), 1e-3)
        )
        dist.barrier()
        in_place.append(time.perf_counter() - t)
        moved.append(stats["bytes_moved"])
        release_memory(model.device)
        # Through DCP on local disk, back to the same layout: save, build, load.
        path = Path(root) / f"r{i}"
        dist.barrier()
        t = time.perf_counter()
        save_checkpoint(path, model.module, optimizer, {"step": i}, dist.get_rank())
        model.close()
        model, optimizer = _build(model_name, target, seq)
        load_checkpoint(path, model.module, optimizer, dist.get_rank())
        dist.barrier()
        via_disk.append(time.perf_counter() - t)
        if dist.get_rank() == 0:
            shutil.rmtree(path, ignore_errors=True)
        plan = plan.replaced(dp=target[0], tp=target[1], pp=target[2])
        _step(model, optimizer, seq)
    return {
        "in_place_s": statistics.median(in_place),
        "dcp_disk_s": statistics.median(via_disk),
        "bytes_moved": statistics.median(moved),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--rounds", type=int, default=2)
    args = parse_args(parser, {"model": "debug", "workers": [4], "rounds": 1}, argv)
    params = FLAVOURS[args.model].param_count()
    print(
        f"{args.model}: {params / 1e6:.1f} M parameters, {params * 12 / 2**20:.0f} MiB of fp32 weights and AdamW state"
    )
    for world in args.workers:
        root = tempfile.mkdtemp(prefix="copus-bench-reshard-")
        r = run_on_gloo_ranks(world, _measure, args.model, world, args.rounds, root)[0]
        print(
            f"{world} ranks: in place {r['in_place_s']:.2f} s (median {r['bytes_moved'] / 2**20:.1f} MiB moved between "
            f"ranks), through DCP on disk {r['dcp_disk_s']:.2f} s: {r['dcp_disk_s'] / r['in_place_s']:.1f}x"
        )


if __name__ == "__main__":
    main()
