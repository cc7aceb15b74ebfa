"""Wall-clock of a full simulated pre-training run: Qwen-2.5-32B on 4x8 H100 to the paper
setting's target loss, every policy of the YAML on one seed (not the protocol's tuned baselines
and seeds: `copus simulate` runs those), step by step (target: under 10 s on this machine).

    .venv/bin/python bench/simulate.py
    .venv/bin/python bench/simulate.py --setting experiments/sim/paper_llama-2-7b_4x8-mi210.yaml
    .venv/bin/python bench/simulate.py --set estimate.mapping_error=4 --set estimate.noise=0.3
    .venv/bin/python bench/simulate.py --smoke     # the static policy alone

The last line reads `full simulated comparison: X s wall-clock`.
"""

from __future__ import annotations

import argparse
import time

from smoke import parse_args

from copus.core.simulator import planner_view, search_space, simulate
from copus.sim.config import load_sim_config, setting_from


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", default="experiments/sim/paper_qwen-2.5-32b_4x8-h100.yaml")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field of the simulation YAML (repeatable), as copus simulate --set",
    )
    args = parse_args(parser, {}, argv)
    if args.smoke:
        args.overrides = [*args.overrides, "policies=[static]"]
    cfg = load_sim_config(args.setting, args.overrides)
    t0 = time.perf_counter()
    setting = setting_from(cfg)
    space = search_space(setting)
    view = planner_view(setting, space)  # the profile the planner reads, fitted once
    t_space = time.perf_counter() - t0
    print(
        f"{cfg.name}: {len(space[0])} feasible configurations scored and profiled in {t_space:.2f} s; truth: "
        f"{setting.critical.source}; planner's mapping error x{cfg.estimate.mapping_error:g}"
    )
    total = t_space
    for policy in cfg.policies:
        t = time.perf_counter()
        r = simulate(setting, policy, space, view)
        spent = time.perf_counter() - t
        total += spent
        ttt = f"{r.time_to_target_s / 3600:.1f} h" if r.time_to_target_s is not None else "not reached"
        print(
            f"  {policy:<16} {r.steps:>8} steps simulated ({ttt} of training, {len(r.reconfigurations)} "
            f"reconfigurations) in {spent:.2f} s wall-clock ({r.steps / spent / 1e3:.0f} k steps/s)"
        )
    print(f"full simulated comparison: {total:.2f} s wall-clock")


if __name__ == "__main__":
    main()
