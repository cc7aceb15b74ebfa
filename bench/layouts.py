"""Samples/s of every valid 3D layout of the quickstart workload on this machine.

For 4 and 8 gloo workers (processes on this machine, the same training step as `copus run`:
`copus.train.replica.train_step`), every layout (dp, tp, pp) the model admits, and a grid of GBS
and MBS values with m = GBS / (dp x MBS) >= pp: median step time over a few timed steps after
warm-up. One process group per layout; batch shapes change between steps inside it, as they
do in training. These figures feed the throughput model (issue 5).

    .venv/bin/python bench/layouts.py                       # 4 and 8 workers, GBS 32/64, MBS 2/4/8
    .venv/bin/python bench/layouts.py --workers 4 --gbs 16 32 --mbs 4 --steps 3
    .venv/bin/python bench/layouts.py --json runs/layouts.json
    .venv/bin/python bench/layouts.py --smoke               # 2 workers, one shape, one step: checks it runs
    .venv/bin/python bench/layouts.py --workers 4 --gbs 32 --mbs 4 --dp-shard none optimizer full \\
        --recompute none selective full                     # with sharding and recomputation

All figures come from one run; on a 2-core machine 8 processes oversubscribe the cores, so
compare layouts within a world size, not across machines. The last line reads
`best of N workers: LAYOUT gbs G mbs M: X samples/s` for the last world size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
from smoke import parse_args

from copus.core.layout import DP_SHARD_MODES, RECOMPUTE_MODES
from copus.core.search import valid_layouts
from copus.parallel.dims import ParallelDims
from copus.train.local import run_on_gloo_ranks
from copus.train.parallel_model import ParallelModel
from copus.train.replica import make_optimizer, train_step
from copus.train.worker_plan import OptimizerPlan
from workloads.flavours import FLAVOURS


def _measure_layout(layout, shapes, args, dp_shard: str = "none", recompute: str = "none") -> list[dict]:
    """On every rank of the layout's process group: the median step time of each batch shape."""
    flavour = FLAVOURS[args.model]
    dims = ParallelDims(*layout)
    model = ParallelModel(flavour, args.seq_len, 0, dims, torch.device("cpu"), dp_shard=dp_shard, recompute=recompute)
    optimizer = make_optimizer(model, OptimizerPlan(), 1e-3)
    gen = torch.Generator().manual_seed(model.dp_rank)
    rows = []
    for gbs, mbs in shapes:
        n = gbs // dims.dp
        inputs = torch.randint(0, flavour.vocab_size, (n, args.seq_len), generator=gen)
        targets = torch.randint(0, flavour.vocab_size, (n, args.seq_len), generator=gen)
        times = []
        for i in range(args.warmup + args.steps):
            dist.barrier()
            t = time.perf_counter()
            train_step(model, optimizer, inputs, targets, mbs, 1e-3, 1.0)
            if i >= args.warmup:
                times.append(time.perf_counter() - t)
        step = statistics.median(times)
        rows.append(
            {
                "dp": dims.dp,
                "tp": dims.tp,
                "pp": dims.pp,
                "dp_shard": model.dp_shard,
                "recompute": recompute,
                "gbs": gbs,
                "mbs": mbs,
                "microbatches": gbs // (dims.dp * mbs),
                "step_time_s": step,
                "samples_per_s": gbs / step,
            }
        )
    return rows


def measure(world: int, layout, shapes, args, dp_shard: str = "none", recompute: str = "none") -> list[dict]:
    return run_on_gloo_ranks(world, _measure_layout, layout, shapes, args, dp_shard, recompute)[0]


def _label(row: dict) -> str:
    knobs = "".join(f" {k}={row[k]}" for k in ("dp_shard", "recompute") if row[k] != "none")
    return f"dp{row['dp']} tp{row['tp']} pp{row['pp']}{knobs}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--gbs", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--mbs", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--dp-shard", nargs="+", default=["none"], choices=DP_SHARD_MODES, help="sharding modes")
    parser.add_argument("--recompute", nargs="+", default=["none"], choices=RECOMPUTE_MODES, help="recomputation")
    parser.add_argument("--json", help="also write all rows to this file")
    smoke = {"model": "debug", "seq_len": 32, "workers": [2], "gbs": [8], "mbs": [2], "warmup": 0, "steps": 1}
    args = parse_args(parser, smoke, argv)
    flavour = FLAVOURS[args.model]
    all_rows = []
    print(
        f"{args.model} seq {args.seq_len}, gloo on {os.cpu_count()} CPU cores; median of {args.steps} steps "
        f"after {args.warmup} warm-up"
    )
    for world in args.workers:
        print(f"\n{world} workers\n{'layout':<52} {'gbs':>5} {'mbs':>4} {'m':>3} {'step s':>8} {'samples/s':>10}")
        for layout in valid_layouts(world, flavour.shape()):
            dp, tp, pp = layout
            shapes = [(g, b) for g in args.gbs for b in args.mbs if g % (dp * b) == 0 and g // (dp * b) >= pp]
            knobs = [(s, r) for s in args.dp_shard if dp > 1 or s == "none" for r in args.recompute]
            for dp_shard, recompute in knobs if shapes else []:
                for row in measure(world, layout, shapes, args, dp_shard, recompute):
                    all_rows.append({"workers": world, **row})
                    print(
                        f"{_label(row):<52} {row['gbs']:>5} {row['mbs']:>4} {row['microbatches']:>3} "
                        f"{row['step_time_s']:>8.3f} {row['samples_per_s']:>10.1f}",
                        flush=True,
                    )
        best = max((r for r in all_rows if r["workers"] == world), key=lambda r: r["samples_per_s"])
        print(
            f"best of {world} workers: {_label(best)} gbs {best['gbs']} mbs {best['mbs']}: {best['samples_per_s']:.1f} samples/s"
        )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(all_rows, indent=2))


if __name__ == "__main__":
    main()
