"""Real runs read for a simulated setting of their cluster (issue 42, item 1): each run's
trajectory (the GBS of every step, its validation losses) for the statistical truth's fit
(`copus.core.truth_fit`), and the wall-clock a real run spends outside its training steps
(start-up, evaluations, the time between steps), which a simulated run adds to its time to target
(`copus.core.simulator.RunOverheads`).

    .venv/bin/python -m copus.sim.fit RUN_DIR [RUN_DIR ...] --experiment EXPERIMENT.yaml [--target 2.2] [--json]

RUN_DIR is a run's output directory (its records.jsonl); the fit uses every run, so give runs at
two GBS or more (a suite's static tuning runs)."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from copus.cluster.run_state import read_records_log
from copus.config import ConfigError, ExperimentConfig, load_config
from copus.core.layout import CandidateConfig
from copus.core.simulator import MeasuredSteps, NoiseEstimate
from copus.core.truth_fit import Trajectory, fit_estimate, fit_truth, predicted_samples_to, samples_to
from copus.sim.config import read_profile_steps
from copus.storage import Location


def _steps(records: list[dict]) -> list[dict]:
    """Step records by step number, the last attempt's where a resumed run repeated a step."""
    by_step = {r["step"]: r for r in records if r.get("kind") == "step" and r.get("gbs")}
    return [by_step[k] for k in sorted(by_step)]


def trajectory_of(run_dir: Path) -> Trajectory:
    records = read_records_log(Location.parse(run_dir))
    steps = _steps(records)
    evals = sorted({r["samples"]: r["val_loss"] for r in records if r.get("kind") == "eval"}.items())
    if not steps or not evals:
        raise ConfigError(f"{run_dir / 'records.jsonl'}: no step or validation records (not a finished run's output?)")
    b_noise = tuple((int(r["samples"]), float(r["b_noise"])) for r in steps if r.get("b_noise") is not None)
    return Trajectory(str(run_dir), tuple(int(r["gbs"]) for r in steps), tuple(evals), b_noise)


def overheads_of(run_dirs: list[Path]) -> dict:
    """What real runs spend outside training steps, pooled over runs (medians): `startup_s`,
    from the run's start to its first step; `eval_s` by layout (a step-0 evaluation, part of the
    start-up, excluded); `between_steps_s`, the wall-clock between two steps beyond the step's
    own time and any evaluation between them (logging, the controller's calls); and the step
    times themselves by configuration (`step_time_s`, with `steps` and `configs` by the same
    label), for the throughput truth's check and `run_factor`."""
    startup, between, evals, step_times = [], [], {}, {}
    configs: dict[str, dict] = {}
    for run_dir in run_dirs:
        records = read_records_log(Location.parse(run_dir))
        steps = _steps(records)
        if not steps:
            continue
        startup.append(steps[0]["wall_clock_s"] - steps[0]["step_time_s"])
        eval_at = {r["step"]: r["eval_time_s"] for r in records if r.get("kind") == "eval" and r.get("step")}
        for before, after in zip(steps, steps[1:]):
            gap = after["wall_clock_s"] - before["wall_clock_s"] - after["step_time_s"] - eval_at.get(before["step"], 0)
            between.append(gap)
        for step in steps:
            config = CandidateConfig(step["dp"], step["tp"], step["pp"], step["mbs"], step["gbs"])
            if step["step"] in eval_at:
                evals.setdefault(config.layout_label(), []).append(eval_at[step["step"]])
            configs[config.label()] = config.as_dict()
            step_times.setdefault(config.label(), []).append(step["step_time_s"])
    if not startup:
        raise ConfigError("overheads: no run has step records")
    return {
        "startup_s": statistics.median(startup),
        "eval_s": {k: statistics.median(v) for k, v in sorted(evals.items())},
        "between_steps_s": statistics.median(between) if between else 0.0,
        "step_time_s": {k: statistics.median(v[1:] or v) for k, v in sorted(step_times.items())},
        "steps": {k: len(v) for k, v in sorted(step_times.items())},
        "configs": {k: configs[k] for k in sorted(configs)},
        "runs": len(startup),
    }


def run_factor(overheads: dict, profile: MeasuredSteps) -> dict:
    """What the runs paid per step over the profile's reading: per configuration the runs
    trained in (their median step time over the profile's step time there, measured or fitted),
    and per layout the median over its configurations, each weighed by its steps (the factor a
    simulated setting's `cluster.run_factor` takes)."""
    rows = []
    for key, fields in overheads["configs"].items():
        config = CandidateConfig.from_dict(fields)
        profiled = profile.profile_step_time(config)
        rows.append(
            {
                "config": key,
                "layout": config.layout_label(),
                "run_step_s": overheads["step_time_s"][key],
                "profile_step_s": profiled,
                "ratio": overheads["step_time_s"][key] / profiled,
                "steps": overheads["steps"][key],
            }
        )
    by_layout = {}
    for layout in sorted({r["layout"] for r in rows}):
        ratios = [(r["ratio"], r["steps"]) for r in rows if r["layout"] == layout]
        by_layout[layout] = _weighted_median(ratios)
    return {"by_layout": by_layout, "configs": rows, "profile": profile.source}


def _weighted_median(values: list[tuple[float, int]]) -> float:
    ordered = sorted(values)
    half, seen = sum(w for _, w in ordered) / 2, 0
    for value, weight in ordered:
        seen += weight
        if seen >= half:
            return value
    return ordered[-1][0]


def fit_report(
    run_dirs: list[Path],
    experiment: ExperimentConfig,
    initial: float,
    min_samples: int | None,
    target: float | None,
    held_out: list[Path] = (),
    profile: Path | None = None,
):
    """The fitted truth, its residuals by run, the live estimate's departure from it (for the
    simulation's `estimate` section) and, with a target, each run's samples to it as measured
    and as the fitted truth gives them for the run's own GBS sequence. The experiment gives the
    sequence length, the LR's reference GBS, c and the estimate's half-life; `min_samples`
    defaults to its warm-up (the truth does not model the LR warm-up). `held_out` runs are not
    fitted; with a target their samples to it are set against the fitted truth's as a check, and
    their noise-scale estimates join the estimate's fit. With `profile` (a `copus profile` table of
    the runs' cluster), the runs' step times over its readings (`run_factor`)."""
    seq_len, b0 = experiment.workload.seq_len, experiment.optimizer.reference_gbs
    floor = experiment.schedule.warmup_samples if min_samples is None else min_samples
    steps = None
    if profile is not None:  # refused before the fit's work
        world = experiment.cluster.num_workers
        wanted = "the runs' experiment is {}, seq_len {} on {} (cluster.num_workers)"
        steps = read_profile_steps(profile, "--profile", experiment.workload.model, seq_len, world, wanted)
    runs = [trajectory_of(d) for d in run_dirs]
    fit = fit_truth(runs, seq_len, initial, floor)
    g = experiment.gns
    lag = NoiseEstimate(half_life_share=g.half_life_share, min_half_life=g.min_half_life)
    checks = [trajectory_of(d) for d in held_out]
    estimate = fit_estimate(runs + checks, fit, seq_len, g.critical_factor, b0, lag, floor)
    out = fit.as_dict() | {"seq_len": seq_len, "min_samples": floor, "critical_factor": g.critical_factor}
    out |= {"estimate": estimate.as_dict() | {"per_run": list(estimate.per_run)}}
    out["overheads"] = overheads_of(list(run_dirs) + list(held_out))
    if steps is not None:
        out["run_factor"] = run_factor(out["overheads"], steps)
    if target is not None:
        out["samples_to_target"] = [
            {
                "run": r.label,
                "measured": samples_to(r, target),
                "fitted": predicted_samples_to(_continued(r), target, fit.curve, fit.critical, seq_len),
                "held_out": r in checks,
            }
            for r in runs + checks
        ]
    return out


def _continued(run: Trajectory, steps: int = 5000) -> list[int]:
    """The run's GBS sequence, its last GBS on after it (the truth may need more steps than the run)."""
    return list(run.gbs_per_step) + [run.gbs_per_step[-1]] * steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m copus.sim.fit", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run output directories (records.jsonl)")
    parser.add_argument("--experiment", required=True, help="the runs' experiment YAML (seq_len, reference GBS, c)")
    parser.add_argument("--initial", type=float, default=math.log(256), help="loss at zero data (default ln 256)")
    parser.add_argument(
        "--min-samples", type=int, help="leave out points before these samples (default: schedule.warmup_samples)"
    )
    parser.add_argument("--target", type=float, help="also report samples to this validation loss")
    parser.add_argument(
        "--held-out",
        nargs="+",
        type=Path,
        default=[],
        metavar="RUN_DIR",
        help="runs checked against the fit, not fitted",
    )
    parser.add_argument(
        "--profile", type=Path, help="a `copus profile` table of the runs' cluster: also the runs' step times over it"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    try:
        experiment = load_config(args.experiment)
        report = fit_report(
            args.run_dirs, experiment, args.initial, args.min_samples, args.target, args.held_out, args.profile
        )
    except (ConfigError, ValueError, OSError) as err:
        print(f"copus.sim.fit: {err}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else _text(report))
    return 0


def _text(report: dict) -> str:
    c, k = report["loss_curve"], report["critical_batch"]
    lines = [
        f"loss_curve: {{e: {c['e']:.4g}, a: 0.0, b: {c['b']:.5g}, beta: {c['beta']:.4g}, initial: {c['initial']:.4g}}}",
        f"critical_batch: {{b_star_tokens: {k['b_star_tokens']:.5g}, alpha_b: {k['alpha_b']:.4g}}}",
        f"residual rms {report['rms_residual']:.4f} nats over {report['points']} points",
    ]
    lines += [
        f"  {r['run']}: rms {r['rms']:.4f}, mean {r['mean_residual']:+.4f} ({r['points']})" for r in report["per_run"]
    ]
    for r in report.get("samples_to_target", []):
        held = " (held out)" if r["held_out"] else ""
        lines.append(f"  to target: {r['run']}: measured {r['measured']}, fitted {r['fitted']}{held}")
    e = report["estimate"]
    lines.append(
        f"estimate: {{mapping_error: {e['mapping_error']:.3g}, noise: {e['noise']:.3g}}} ({e['points']} points)"
    )
    o = report["overheads"]
    lines.append(f"startup {o['startup_s']:.1f} s, between steps {o['between_steps_s']:.3f} s, eval {o['eval_s']}")
    if "run_factor" in report:
        factors = ", ".join(f"{k}: {v:.3f}" for k, v in report["run_factor"]["by_layout"].items())
        lines.append(f"run_factor: {{{factors}}} (runs' step time over the profile's)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
