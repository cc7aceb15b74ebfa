"""Cost of the GNS probe: step time with and without it, per layout, as a ratio measured in
the same run (rounds alternate probe off / on, so machine noise hits both alike).

    .venv/bin/python bench/gns_overhead.py
    .venv/bin/python bench/gns_overhead.py --layouts 1,1,1 2,1,1 --rounds 3
    .venv/bin/python bench/gns_overhead.py --smoke     # one layout of 2 ranks, one round

The last line reads `worst probe overhead: +X%`.

The quickstart workload (tiny, seq 128), GBS 32, MBS 4, gloo processes on this machine.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
from smoke import parse_args

from copus.parallel.dims import ParallelDims
from copus.train.local import run_on_gloo_ranks
from copus.train.parallel_model import ParallelModel
from copus.train.replica import make_optimizer, train_step
from copus.train.worker_plan import OptimizerPlan
from workloads.flavours import FLAVOURS


def _timed_steps(model, optimizer, inputs, targets, mbs, steps) -> list[float]:
    times = []
    for _ in range(steps):
        if dist.is_initialized():
            dist.barrier()
        t = time.perf_counter()
        train_step(model, optimizer, inputs, targets, mbs, 1e-3, 1.0)
        times.append(time.perf_counter() - t)
    return times


def _measure(layout, args) -> dict:
    """On every rank: median step time with the probe off and on, rounds alternating."""
    if not dist.is_initialized():
        torch.set_num_threads(2)  # one process: both cores (ranks of a group get one each)
    flavour = FLAVOURS[args.model]
    model = ParallelModel(flavour, args.seq_len, 0, ParallelDims(*layout), torch.device("cpu"))
    optimizer = make_optimizer(model, OptimizerPlan(), 1e-3)
    n = args.gbs // layout[0]
    gen = torch.Generator().manual_seed(model.dp_rank)
    inputs = torch.randint(0, flavour.vocab_size, (n, args.seq_len), generator=gen)
    targets = torch.randint(0, flavour.vocab_size, (n, args.seq_len), generator=gen)
    _timed_steps(model, optimizer, inputs, targets, args.mbs, 2)  # warm-up
    off, on = [], []
    for _ in range(args.rounds):
        off += _timed_steps(model, optimizer, inputs, targets, args.mbs, args.steps)
        model.attach_probe()
        on += _timed_steps(model, optimizer, inputs, targets, args.mbs, args.steps)
        model.detach_probe()
    return {"off": statistics.median(off), "on": statistics.median(on)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--gbs", type=int, default=32)
    parser.add_argument("--mbs", type=int, default=4)
    parser.add_argument("--layouts", nargs="+", default=["1,1,1", "2,1,1", "1,2,1", "1,1,2", "2,2,1"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    smoke = {"model": "debug", "seq_len": 32, "gbs": 8, "mbs": 2, "layouts": ["2,1,1"], "rounds": 1, "steps": 1}
    args = parse_args(parser, smoke, argv)
    print(
        f"{args.model} seq {args.seq_len}, gbs {args.gbs}, mbs {args.mbs}; median step time of "
        f"{args.rounds} x {args.steps} steps each way, rounds alternating"
    )
    print(f"{'layout':>10} {'off s':>8} {'on s':>8} {'overhead':>9}")
    worst = float("-inf")
    for text in args.layouts:
        layout = tuple(int(v) for v in text.split(","))
        world = layout[0] * layout[1] * layout[2]
        r = run_on_gloo_ranks(world, _measure, layout, args)[0]
        overhead = r["on"] / r["off"] - 1
        worst = max(worst, overhead)
        print(f"{'dp%d tp%d pp%d' % layout:>10} {r['off']:>8.3f} {r['on']:>8.3f} {overhead:>+8.1%}", flush=True)
    print(f"worst probe overhead: {worst:+.1%}")


if __name__ == "__main__":
    main()
