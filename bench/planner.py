"""Decision latency of the Goodput planner for a 32-GPU search space (Llama-2-13B shape on
4 nodes of 8 GPUs: every valid dp × tp × pp layout of 32, MBS 1/2/4/8, GBS on the ≈√2 grid
32..4096). Prints the number of candidates, the one-off cost of scoring their throughput, and
the median and worst time of one decision (all candidates scored by goodput, best picked,
hysteresis and restart-cost rule applied) over a sweep of noise scales.

    .venv/bin/python bench/planner.py
    .venv/bin/python bench/planner.py --smoke    # 8 GPUs, 20 decisions

The last line reads `enumerate + score + decide from scratch: X ms`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from smoke import parse_args

from copus.core.layout import DP_SHARD_MODES, RECOMPUTE_MODES
from copus.core.planner import Planner, SwitchCosts
from copus.core.search import candidates, gbs_grid, valid_layouts
from copus.core.throughput import StepTimeModel, StepTimeParams
from workloads.flavours import FLAVOURS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=32)
    parser.add_argument("--decisions", type=int, default=400)
    args = parse_args(parser, {"gpus": 8, "decisions": 20}, argv)
    shape = FLAVOURS["llama-2-13b"].shape()
    t = time.perf_counter()
    cands = candidates(
        valid_layouts(args.gpus, shape), [1, 2, 4, 8], gbs_grid(32, 4096), shape, DP_SHARD_MODES, RECOMPUTE_MODES
    )
    enumerate_s = time.perf_counter() - t
    model = StepTimeModel(
        StepTimeParams(
            a0=0.01, a1=0.9, c0=0.002, c1=0.01, p0=0.004, p1=0.002, d0=0.01, d1=2e-11, o0=0.05, o1=1e-11, z=1.0
        ),
        shape,
    )
    t = time.perf_counter()
    planner = Planner(cands, lambda cfgs: np.array([c.gbs for c in cfgs]) / model.step_times(cfgs), 64, form="lr-aware")
    build_s = time.perf_counter() - t
    times = []
    current = cands[0]
    for b_noise in np.geomspace(1, 10_000, args.decisions):
        t = time.perf_counter()
        d = planner.decide(current, float(b_noise), interval_s=300, costs=SwitchCosts(60.0, 60.0))
        times.append(time.perf_counter() - t)
        current = d.target
    print(
        f"{args.gpus}-GPU search space: {len(cands)} candidates ({len(valid_layouts(args.gpus, shape))} layouts x MBS x GBS x "
        f"{len(DP_SHARD_MODES)} sharding x {len(RECOMPUTE_MODES)} recomputation modes)"
    )
    print(f"enumerate {enumerate_s * 1e3:.1f} ms, score throughputs once {build_s * 1e3:.1f} ms")
    print(
        f"one decision: median {statistics.median(times) * 1e3:.2f} ms, worst {max(times) * 1e3:.2f} ms "
        f"over {len(times)} decisions (target < 100 ms)"
    )
    print(f"enumerate + score + decide from scratch: {(enumerate_s + build_s + max(times)) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
