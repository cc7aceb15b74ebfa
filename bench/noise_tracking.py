"""Does the run's noise estimate keep up with training? At each branch point of a calibration,
the live estimate a controller would read under each horizon (`gns.horizon`, copus.core.gns)
against B_noise measured at the branch point's fixed weights, with its 95% interval, and the
critical factor c = B_crit / live estimate each horizon implies (B_crit from the calibration).

    .venv/bin/python bench/noise_tracking.py experiments/tradeoff_cpu.yaml --calibration docs/calibration-tradeoff.json
    .venv/bin/python bench/noise_tracking.py experiments/quickstart.yaml --calibration docs/calibration-quickstart.json
    .venv/bin/python bench/noise_tracking.py experiments/quickstart.yaml --smoke

One reference run, the calibration's (one process at the reference GBS, the experiment's seed),
to the last branch point. Its steps' two-batch norms are replayed through every horizon: under a
√ or linear LR rule the estimate does not act on training, so one run serves all horizons.
The fixed-weight measurement uses `--gns-steps` batches at each branch point's weights.

The last line reads `tracking: progress xA, fixed xB` (A, B: the median over branch points of
live estimate / fixed-weight measurement; 1 is a live estimate that keeps up).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

from smoke import parse_args

from copus.cluster.launch import prepare_plan
from copus.config import load_config
from copus.core.gns import GNSEstimator, Horizon
from copus.train.calibrate import branch_noise_scales, reference_run
from copus.train.worker_plan import GNSPlan

HORIZONS = ("progress", "fixed")


def horizon_of(name: str, gns: GNSPlan, b0: int) -> Horizon:
    """The experiment's horizon settings, in the named form."""
    share = gns.half_life_share if gns.half_life_share is not None else GNSPlan.half_life_share
    return replace(gns, half_life_share=share if name == "progress" else None).horizon(b0)


def replay(records: list[dict], horizon: Horizon, b0: int, outlier_ratio: float | None = None) -> dict[int, float]:
    """The live estimate after every step, as the run would have had it under `horizon` (and
    the experiment's outlier weighting)."""
    est, out = GNSEstimator(b0, horizon=horizon, outlier_ratio=outlier_ratio), {}
    for r in records:
        if r["kind"] == "step" and r.get("gns_b_big") is not None:
            est.update(r["gns_sq_small"], r["gns_b_small"], r["gns_sq_big"], r["gns_b_big"], r["samples"])
            out[r["samples"]] = est.b_noise
    return out


def measure(cfg_path: str, calibration: str | None, args) -> list[dict]:
    cfg = load_config(cfg_path)
    if cfg.optimizer.lr_scaling == "adascale":
        raise SystemExit(f"{cfg_path}: optimizer.lr_scaling adascale: the estimate acts on training, no replay")
    cal = json.loads(Path(calibration).read_text()) if calibration else None
    branches = args.branch_samples or (cal["settings"]["branch_samples"] if cal else cfg.calibration_branches())
    val_samples = cal["settings"]["val_samples"] if cal else cfg.eval.val_samples
    b_crit = {b["samples_seen"]: b["b_crit"] for b in cal["branch_points"]} if cal else {}
    _, plan = prepare_plan(cfg)
    b0 = cfg.optimizer.reference_gbs
    records: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        points = reference_run(plan, branches, Path(tmp), val_samples, records)
        live = {name: replay(records, horizon_of(name, plan.gns, b0), b0, plan.gns.outlier_ratio) for name in HORIZONS}
        rows = []
        for p in points:
            fixed = branch_noise_scales(plan, Path(p["checkpoint"]), args.gns_steps)
            row = {
                "samples": p["samples"],
                "val_loss": p["val_loss"],
                "fixed_weights": fixed["b_noise"],
                "fixed_weights_interval": [fixed["b_noise_low"], fixed["b_noise_high"]],
                "b_crit": b_crit.get(p["samples"]),
            }
            for name in HORIZONS:
                estimate = live[name].get(p["samples"], math.nan)
                row[name] = estimate
                row[f"c_{name}"] = row["b_crit"] / estimate if row["b_crit"] and estimate > 0 else None
            rows.append(row)
    return rows


def print_table(name: str, rows: list[dict]) -> None:
    print(f"\n{name}: B_noise at the branch points (fixed weights with 95% interval; live estimates)")
    print("samples  val_loss  fixed_weights [95%]        progress  fixed    B_crit   c_progress  c_fixed")
    for r in rows:
        low, high = r["fixed_weights_interval"]
        c = [f"{r[k]:.1f}" if r[k] is not None else "-" for k in ("c_progress", "c_fixed")]
        b_crit = f"{r['b_crit']:.1f}" if r["b_crit"] is not None else "-"
        print(
            f"{r['samples']:>7}  {r['val_loss']:.3f}     {r['fixed_weights']:8.1f} [{low:7.1f}, {high:7.1f}]  "
            f"{r['progress']:8.1f}  {r['fixed']:7.1f}  {b_crit:>6}   {c[0]:>9}  {c[1]:>7}"
        )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment", nargs="?", default="experiments/quickstart.yaml")
    parser.add_argument("--calibration", help="a calibration file of this workload: B_crit per branch point")
    parser.add_argument("--gns-steps", type=int, default=64, help="batches of the fixed-weight measurement")
    parser.add_argument("--branch-samples", type=int, nargs="+", help="default: the calibration's")
    parser.add_argument("--json", help="also write the rows here")
    args = parse_args(parser, {"gns_steps": 4, "branch_samples": [32, 64]}, argv)
    rows = measure(args.experiment, args.calibration, args)
    print_table(args.experiment, rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    ratios = {name: [r[name] / r["fixed_weights"] for r in rows if r["fixed_weights"] > 0] for name in HORIZONS}
    medians = {name: statistics.median(v) if v else math.nan for name, v in ratios.items()}
    print(f"tracking: progress x{medians['progress']:.2f}, fixed x{medians['fixed']:.2f}")


if __name__ == "__main__":
    main()
