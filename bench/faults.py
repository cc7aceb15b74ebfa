"""Time a crash costs, measured in one invocation on the quickstart:

1. a worker killed (SIGKILL) mid-run: static policy, clean run against a run where rank 1 dies
   as step KILL_STEP starts (after a 5 s pause that lets Ray register the last checkpoint). Ray
   Train restarts the worker group from the last checkpoint (every 100 steps here); the cost is
   the group restart and reload plus the steps redone.
2. the controller killed mid-run: copus policy (a 60 s profile first, shared by both runs),
   clean run against a run whose controller actor is killed (as if its process crashed) 15 s
   into training. Ray restarts it, it recovers its state from its file; training goes on
   meanwhile, so the cost is only what the controller's decisions are late by.

    .venv/bin/python bench/faults.py          # about 6 minutes on 2 cores
    .venv/bin/python bench/faults.py --smoke  # a few steps, the controller-killed run only, on a stated
                                              # profile table: checks it runs

The last line reads `time lost to one controller kill: X s (Y% of the clean run)`.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

import ray
from smoke import parse_args

from copus.cluster.driver import run_experiment
from copus.cluster.profiler import save_stated_table
from copus.config import load_config
from copus.core.layout import CandidateConfig

# --smoke: a run of 24 steps with a checkpoint every 8 (each one is a Ray Train report, a barrier
# of up to a health-check interval), the controller killed 0.1 s into training, and instead of a
# profiling run a stated table of two points (one layout, one MBS): profiling is tested on its own
# (tests/cluster/test_profile.py), and here it was a third of the smoke's time.
SMOKE_OVERRIDES = [
    "stop.max_steps=24",
    "checkpoint.every_steps=8",
    "eval.every_steps=12",
    "search.layouts=[[2,1,1]]",
    "search.mbs=[8]",
    "search.gbs_min=16",
    "search.gbs_max=32",
]
SMOKE_TABLE = {CandidateConfig(2, 1, 1, 8, 16): 100.0, CandidateConfig(2, 1, 1, 8, 32): 150.0}  # samples/s


def _line(name: str, s: dict) -> str:
    ttt = f"{s['time_to_target_s']:.1f} s" if s["reached_target"] else "not reached"
    return f"{name:<22} time to target {ttt:>10}, {s['steps']} steps, {len(s['reconfigurations'])} reconfigurations"


def _lost(clean: dict | None, hit: dict) -> str:
    if clean is None:
        return "n/a (no clean run: --smoke)"
    if not (clean["reached_target"] and hit["reached_target"]):
        return "n/a (a run missed the target)"
    lost = hit["time_to_target_s"] - clean["time_to_target_s"]
    return f"{lost:.1f} s ({lost / clean['time_to_target_s']:+.0%} of the clean run)"


def _kill_controller_after(seconds: float, out: Path) -> None:
    log = out / "records.jsonl"
    while not (log.is_file() and '"kind": "step"' in log.read_text()):
        time.sleep(0.5)
    time.sleep(seconds)
    for name in ray.util.list_named_actors():
        if name.startswith("copus-controller-"):
            ray.kill(ray.get_actor(name), no_restart=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kill-step", type=int, default=150)
    parser.add_argument("--controller-kill-after", type=float, default=15.0, help="seconds into training")
    args = parse_args(parser, {"kill_step": 10, "controller_kill_after": 0.1}, argv)
    root = Path(tempfile.mkdtemp(prefix="copus-bench-faults-"))
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    common = [
        f"tracking.uri=sqlite:///{root / 'mlflow.db'}",
        "tracking.experiment=bench-faults",
        f"profile.table_dir={root / 'profiles'}",
        "profile.budget_s=60",
    ] + (SMOKE_OVERRIDES if args.smoke else [])

    def run(name: str, extra: list[str], kill_env: str | None = None, controller_kill: bool = False) -> dict:
        cfg = load_config("experiments/quickstart.yaml", common + extra + [f"output_dir={root / name}"])
        if args.smoke and cfg.policy.name == "copus":
            save_stated_table(cfg, SMOKE_TABLE, folds=2)
        if kill_env:
            os.environ["COPUS_INJECT_WORKER_KILL"] = kill_env
        killer = threading.Thread(
            target=_kill_controller_after, args=(args.controller_kill_after, root / name), daemon=True
        )
        if controller_kill:
            killer.start()
        try:
            return run_experiment(cfg, fresh=True, echo=lambda line: None)
        finally:
            os.environ.pop("COPUS_INJECT_WORKER_KILL", None)

    # --smoke: the one run its last line is about, the controller's kill: each Ray run is most of
    # a smoke's time, and the tests cover the recoveries themselves (a worker's kill:
    # tests/cluster/test_object_storage.py, a node's: tests/test_emulated_cluster.py).
    clean = None if args.smoke else run("static-clean", [])
    killed = None if args.smoke else run("static-worker-killed", [], kill_env=str(args.kill_step))
    copus_clean = None if args.smoke else run("copus-clean", ["policy.name=copus", "policy.interval_s=15"])
    copus_hit = run("copus-controller-killed", ["policy.name=copus", "policy.interval_s=15"], controller_kill=True)
    ray.shutdown()
    if clean is not None:
        print(_line("static", clean))
    if killed is not None:
        print(_line("static, worker killed", killed))
        for f in killed["worker_failures"]:
            print(
                f"  killed at step {args.kill_step}: resumed at step {f['resumed_at_step']}, "
                f"{f['steps_lost']} steps redone"
            )
    if copus_clean is not None:
        print(_line("copus", copus_clean))
    print(_line("copus, controller killed", copus_hit))
    print(f"  controller restarts: {copus_hit['controller']['restarts']}")
    if copus_hit["controller"]["restarts"] < 1:
        raise SystemExit("faults: the controller run ended without a controller restart: the kill missed it")
    if killed is not None:
        print(f"time lost to one worker kill: {_lost(clean, killed)}")
    print(f"time lost to one controller kill: {_lost(copus_clean, copus_hit)}")


if __name__ == "__main__":
    main()
