"""How well the planner's horizon reads the rest of a run, on runs that reached their target.

At every evaluation from 20% of the way to the target on, the horizon (`copus.core.horizon`: a
power law fitted to the validation curve, its crossing of the target at the 16% quantile, z = 1)
is read as if the run were there, and set against the samples that were really left. A ratio
under 1 is a horizon that errs short (a costly switch refused that would have repaid), over 1
one that errs long. The horizon's window today (the evaluations of the latest doubling of the
samples) is set beside the rule before it (the latest 8 evaluations).

    .venv/bin/python bench/horizon.py --experiment emulated-layout-long     # runs in ./mlflow.db
    .venv/bin/python bench/horizon.py --curves tests/data/horizon/emulated-pilot-curves.json
    .venv/bin/python bench/horizon.py --smoke                               # the stored curves

Runs are read from MLflow (`--tracking-uri`, default the project's `sqlite:///mlflow.db`): each
finished run of `--experiment` with a `val_loss` history, its samples at each evaluation from the
`samples` metric at that step; the target is `--target`, else the run's `stop.target_val_loss`.

The last line reads `horizon/left xA (p10 xB, p90 xC) over N readings of R runs; the latest 8
evaluations xD (p10 xE, p90 xF)` (medians and percentiles of the ratio).
"""

from __future__ import annotations

import argparse
import bisect
import json
from pathlib import Path

import numpy as np
from smoke import parse_args

STORED = Path(__file__).resolve().parent.parent / "tests" / "data" / "horizon" / "emulated-pilot-curves.json"
Z = 1.0  # the planner's default quantile (copus.core.decision_rule.DEFAULT_QUANTILE_Z)


def curves_from_file(path: Path) -> list[dict]:
    data = json.loads(Path(path).read_text())
    return [{**r, "target": data["target_val_loss"]} for r in data["runs"]]


def curves_from_mlflow(tracking_uri: str, experiment: str, target: float | None) -> list[dict]:
    """Each run's validation curve: (samples seen at the evaluation's step, val_loss)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise SystemExit(f"--experiment: no MLflow experiment {experiment!r} in {tracking_uri}")
    out = []
    for run in client.search_runs([found.experiment_id]):
        vals = client.get_metric_history(run.info.run_id, "val_loss")
        seen = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "samples"))
        run_target = target if target is not None else run.data.params.get("stop.target_val_loss")
        if not vals or run_target in (None, "None"):
            continue
        steps = [s for s, _ in seen]
        vals = sorted(vals, key=lambda m: m.step)
        samples = [seen[i][1] if i >= 0 else 0.0 for i in (bisect.bisect_right(steps, m.step) - 1 for m in vals)]
        losses = [m.value for m in vals]
        out.append({"name": run.info.run_name, "samples": samples, "val_loss": losses, "target": float(run_target)})
    return out


def summary(ratios: list[float]) -> tuple[float, float, float]:
    return tuple(float(np.percentile(ratios, q)) for q in (50, 10, 90))


def main() -> None:
    from copus.core.horizon import latest_points, latest_span, read_ratios

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--experiment", help="the MLflow experiment whose runs are read")
    parser.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    parser.add_argument("--curves", type=Path, help="a stored curves file instead of MLflow")
    parser.add_argument("--target", type=float, help="the target validation loss (default: each run's)")
    args = parse_args(parser, {"curves": STORED, "experiment": None})
    if args.curves is None and args.experiment is None:
        parser.error("--experiment or --curves is needed")
    runs = (
        curves_from_file(args.curves)
        if args.curves
        else curves_from_mlflow(args.tracking_uri, args.experiment, args.target)
    )
    now, before = [], []
    for r in runs:
        ours = read_ratios(r["samples"], r["val_loss"], r["target"], Z, latest_span)
        old = read_ratios(r["samples"], r["val_loss"], r["target"], Z, latest_points(8))
        if ours:
            print(
                f"  {r['name']}: horizon/left x{summary(ours)[0]:.2f}, latest 8 x{summary(old)[0]:.2f} ({len(ours)} readings)"
            )
        now += ours
        before += old
    if not now:
        raise SystemExit("no run reached its target: nothing to read the horizon against")
    a, b = summary(now), summary(before)
    print(
        f"horizon/left x{a[0]:.2f} (p10 x{a[1]:.2f}, p90 x{a[2]:.2f}) over {len(now)} readings of {len(runs)} runs; "
        f"the latest 8 evaluations x{b[0]:.2f} (p10 x{b[1]:.3f}, p90 x{b[2]:.2f})"
    )


if __name__ == "__main__":
    main()
