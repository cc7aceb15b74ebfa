"""Outlier steps in the live noise estimate: how far one step moves it, with and without the
estimator's outlier weighting (`gns.outlier_ratio`, copus.core.gns), on recorded runs.

A step's tr(Σ) estimate is heavy-tailed: an outlier batch (a loss spike) gives one 50-100x the
average's, and with a half-life of a few dozen steps the estimate jumps at once. Every run's
two-batch norms are replayed through the estimator as the run had it (its progress horizon) and
through the same with outlier weighting, and compared: the largest one-step jump of the
estimate once it has settled (after `--settle` steps), the weighted estimate over the plain one
(median over the run's steps: the bias the weighting costs), the steps weighted down, and the
estimate at each change the run made (its step and kind: plain -> weighted).

    .venv/bin/python bench/noise_outliers.py runs/emulated-layout-long-*/           # run directories
    .venv/bin/python bench/noise_outliers.py --norms tests/data/noise/emulated-pilot-norms.json
    .venv/bin/python bench/noise_outliers.py --smoke                                # two stored runs
    .venv/bin/python bench/noise_outliers.py runs/emulated-layout-long-*/ --save FILE   # store them

Run directories hold `records.jsonl` (step records with `gns_sq_small` ..., as every run
writes them); the horizon is `--reference-gbs`, `--half-life-share`, `--min-half-life` (the
emulated experiments': 16, 0.05, 8).

The last line reads `outliers: largest one-step jump xA plain, xB weighted (median over runs xC,
xD); weighted/plain xE (runs xF-xG); N of S steps weighted down, R runs` (A, B: the largest over
every run; E: the median over runs of each run's median ratio).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from smoke import parse_args

from copus.core.gns import GNSEstimator, Horizon

STORED = Path(__file__).resolve().parent.parent / "tests" / "data" / "noise" / "emulated-pilot-norms.json"


def runs_from_dirs(dirs: list[str]) -> dict[str, dict]:
    """Each run's two-batch norms (step, samples, sq_small, b_small, sq_big, b_big) and changes."""
    out = {}
    for d in dirs:
        steps, changes = [], []
        for line in (Path(d) / "records.jsonl").read_text().splitlines():
            r = json.loads(line)
            if r.get("kind") == "step" and r.get("gns_b_big") is not None:
                norms = [_five(r["gns_sq_small"]), r["gns_b_small"], _five(r["gns_sq_big"]), r["gns_b_big"]]
                steps.append([r["step"], r["samples"], *norms])
            elif r.get("kind") == "reconfigure":
                changes.append({"step": r["step"], "change": r["change"], "b_noise": r.get("b_noise")})
        out[Path(d).name] = {"steps": steps, "changes": changes}
    return out


def _five(x: float) -> float:
    """Five significant digits: what a stored file keeps of a norm (the replay's figures move in
    the fourth digit at most)."""
    return float(f"{x:.5g}")


def replay(steps: list[list], horizon: Horizon, b0: int, ratio: float | None) -> tuple[list[float], int]:
    """The estimate after every step, and the steps weighted down."""
    est, out = GNSEstimator(b0, horizon=horizon, outlier_ratio=ratio), []
    for _, samples, sq_small, b_small, sq_big, b_big in steps:
        est.update(sq_small, b_small, sq_big, b_big, samples)
        out.append(est.b_noise)
    return out, est.state.downweighted


def largest_jump(estimates: list[float], settle: int) -> float:
    """The largest factor one step moves the estimate by, after `settle` steps."""
    logs = [math.log(x) if x > 0 and math.isfinite(x) else math.nan for x in estimates]
    jumps = [abs(b - a) for a, b in zip(logs[settle:], logs[settle + 1 :]) if math.isfinite(a) and math.isfinite(b)]
    return math.exp(max(jumps)) if jumps else math.nan


def compare(run: dict, horizon: Horizon, b0: int, ratio: float, settle: int) -> dict:
    plain, _ = replay(run["steps"], horizon, b0, None)
    weighted, down = replay(run["steps"], horizon, b0, ratio)
    ratios = [
        w / p for w, p in zip(weighted[settle:], plain[settle:]) if p > 0 and math.isfinite(p) and math.isfinite(w)
    ]
    index = {s[0]: i for i, s in enumerate(run["steps"])}
    changes = [
        {
            "step": c["step"],
            "change": c["change"],
            "plain": plain[index[c["step"]]],
            "weighted": weighted[index[c["step"]]],
        }
        for c in run["changes"]
        if c["step"] in index
    ]
    return {
        "steps": len(run["steps"]),
        "downweighted": down,
        "jump_plain": largest_jump(plain, settle),
        "jump_weighted": largest_jump(weighted, settle),
        "ratio": statistics.median(ratios) if ratios else math.nan,
        "changes": changes,
    }


def print_rows(rows: dict[str, dict]) -> None:
    print(
        "run                                     steps  down  jump plain  weighted  weighted/plain  estimate at its changes"
    )
    for name, r in rows.items():
        at = ", ".join(f"{c['step']} {c['change']}: {c['plain']:.0f} -> {c['weighted']:.0f}" for c in r["changes"])
        print(
            f"{name:<40} {r['steps']:>5} {r['downweighted']:>5}  x{r['jump_plain']:<9.2f} x{r['jump_weighted']:<7.2f}"
            f"  x{r['ratio']:<13.3f}  {at or '-'}"
        )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", help="run directories (records.jsonl)")
    parser.add_argument("--norms", help="a stored file of runs' two-batch norms (--save writes one)")
    parser.add_argument("--save", help="write the runs' two-batch norms and changes here")
    parser.add_argument("--ratio", type=float, default=8.0, help="the outlier ratio to weigh with")
    parser.add_argument("--reference-gbs", type=int, default=16)
    parser.add_argument("--half-life-share", type=float, default=0.05)
    parser.add_argument("--min-half-life", type=float, default=8.0, help="in reference batches")
    parser.add_argument("--settle", type=int, default=50, help="steps before jumps count")
    parser.add_argument("--max-runs", type=int, default=None)
    args = parse_args(parser, {"norms": str(STORED), "runs": [], "max_runs": 2}, argv)
    if bool(args.runs) == bool(args.norms):
        parser.error("give run directories or --norms FILE")
    runs = runs_from_dirs(args.runs) if args.runs else json.loads(Path(args.norms).read_text())["runs"]
    if args.save:
        Path(args.save).write_text(
            json.dumps({"reference_gbs": args.reference_gbs, "runs": runs}, separators=(",", ":"))
        )
    names = sorted(runs)[: args.max_runs]
    horizon = Horizon(args.half_life_share, args.min_half_life * args.reference_gbs)
    rows = {n: compare(runs[n], horizon, args.reference_gbs, args.ratio, args.settle) for n in names}
    print_rows(rows)
    jumps_p, jumps_w = [r["jump_plain"] for r in rows.values()], [r["jump_weighted"] for r in rows.values()]
    ratios = [r["ratio"] for r in rows.values()]
    down, total = sum(r["downweighted"] for r in rows.values()), sum(r["steps"] for r in rows.values())
    print(
        f"outliers: largest one-step jump x{max(jumps_p):.2f} plain, x{max(jumps_w):.2f} weighted (median over runs "
        f"x{statistics.median(jumps_p):.2f}, x{statistics.median(jumps_w):.2f}); weighted/plain x{statistics.median(ratios):.3f} "
        f"(runs x{min(ratios):.3f}-x{max(ratios):.3f}); {down} of {total} steps weighted down, {len(rows)} runs"
    )


if __name__ == "__main__":
    main()
