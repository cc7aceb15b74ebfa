"""Downtime of a layout change with a worker-group restart, on 4 and 8 CPU workers.

For each world size, a short `copus run` (policy copus, the debug model) starts data-parallel
over all workers; a scripted profile table (the pipeline layout twice as fast) and a large
scripted noise scale make the controller's first decision a layout change. Printed: the
measured downtime, from the stop decision at a step boundary (checkpoint, worker group ends,
driver relaunches the TorchTrainer, workers start, load and reshard the checkpoint) to the
start of the first step in the new layout, as logged to MLflow as
`reconfiguration_downtime_s`. (An in-place GBS change costs well under a millisecond:
tests/cluster/test_controller.py logs it.)

    .venv/bin/python bench/reconfigure.py                 # 4 and 8 workers, about 3 minutes on 2 cores
    .venv/bin/python bench/reconfigure.py --workers 4
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import ray

from copus.cluster.driver import run_experiment
from copus.cluster.profiler import detect_hardware, workload_key
from copus.config import config_from_mapping
from copus.core.throughput import Config
from copus.profile_table import ProfileTable, profile_key
from workloads.flavours import FLAVOURS


def measure(world: int, root: Path) -> list[dict]:
    dp_only, piped = (world, 1, 1), (world // 2, 1, 2)
    mapping = {
        "name": f"reconfigure-{world}",
        "workload": {"model": "debug", "seq_len": 64},
        "batch": {"gbs": 16, "mbs": 2},
        "parallel": dict(zip(("dp", "tp", "pp"), dp_only)),
        "cluster": {"num_workers": world},
        "search": {"gbs_min": 16, "gbs_max": 32, "mbs": [2], "layouts": [list(dp_only), list(piped)]},
        "policy": {"name": "copus", "interval_s": 2.0, "restart_cost_s": 0.1},
        "stop": {"max_steps": 60},
        "eval": {"every_steps": 1000, "val_samples": 16},
        "checkpoint": {"every_steps": 1000},
        "tracking": {"uri": f"sqlite:///{root / 'mlflow.db'}", "experiment": "bench-reconfigure"},
        "output_dir": str(root / f"w{world}"),
    }
    cfg = config_from_mapping(mapping)
    table = ProfileTable(profile_key(workload_key(cfg), detect_hardware(cfg), world))
    # Scripted: the pipeline layout at GBS 32 is best by far once the noise scale is known.
    for (dp, tp, pp), gbs, per_s in ((dp_only, 16, 100.0), (dp_only, 32, 130.0), (piped, 16, 50.0), (piped, 32, 260.0)):
        table.record(Config(dp, tp, pp, 2, gbs), status="ok", source="measured", step_time_s=gbs / per_s,
                     step_times=[gbs / per_s], samples_per_s=per_s)
    table.fit(FLAVOURS["debug"].shape(), folds=2)
    table.save(cfg.resolved_profile_dir())
    summary = run_experiment(cfg, fresh=True, echo=lambda line: None, b_noise_script=(60.0, 1000.0))
    return summary["reconfigurations"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 8])
    args = parser.parse_args()
    ray.init(num_cpus=max(args.workers), include_dashboard=False, log_to_driver=False)
    root = Path(tempfile.mkdtemp(prefix="copus-bench-reconfigure-"))
    print(f"{'workers':>7} {'change':<48} {'kind':<9} {'downtime s':>10}")
    for world in args.workers:
        for r in measure(world, root):
            f, t = r["from"], r["to"]
            change = f"dp{f['dp']}-pp{f['pp']} gbs{f['gbs']} -> dp{t['dp']}-pp{t['pp']} gbs{t['gbs']} (step {r['step']})"
            print(f"{world:>7} {change:<48} {'in place' if r['in_place'] else 'restart':<9} {r['downtime_s']:>10.2f}",
                  flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
