"""`copus calibrate EXPERIMENT.yaml`: measure the critical batch of a workload.

1. A reference run at the reference GBS (B0 = optimizer.reference_gbs) from the experiment's
   initial weights leaves a checkpoint at every branch point (`calibration.branch_samples`),
   and the noise scale is measured at each (raw and Adam-preconditioned, at fixed weights).
2. From every branch point, at every GBS of the grid (`calibration.gbs`) and for every seed,
   a continuation trains with the experiment's LR rule until the validation loss is
   `calibration.decrement` below the branch point's. These runs are independent: they are
   Ray Tune trials (a grid search), one at a time on a small machine (each takes the
   driver's cores), side by side on a cluster (`calibration.cpus_per_trial`).
3. Each branch point is fitted (copus.core.calibration) and the calibration is written,
   atomically, beside the experiment's profile table as calibration-<id>.json; the Goodput
   controller of every later run of the same workload reads it.

Restartable: the reference run's branch points and every finished continuation are kept in
calibration-<id>/ in the profile directory; a rerun (after Ctrl-C, say) does only what is
missing. MLflow: a parent run with the fits, a child run per continuation.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from pathlib import Path
from typing import Callable

import ray
from ray import tune

from copus.cluster.calibration_reuse import imported_points, load_reusable, provenance
from copus.cluster.launch import join_cluster, prepare_plan
from copus.cluster.profile_table import key_id
from copus.config import ConfigError, ExperimentConfig
from copus.core.calibration import (
    CalibrationResult,
    Sweep,
    calibration_problem,
    finite_json,
    fit_branches,
    grid_points,
    lr_probe_table,
    samples_by_gbs,
    with_noise_scales,
)
from copus.core.schedule import batch_scale
from copus.core.transient import transient_table
from copus.storage import Location, local_copy, ray_storage_args, staged_directory, write_json_atomic
from copus.tracking import Tracker, flatten
from copus.train.worker_plan import WorkerPlan
from workloads.corpus import file_windows

SCHEMA_VERSION = 1
# How a continuation's samples to the decrement are read off its validation curve; part of the
# work folder's id, so points measured another way are never mixed in.
CROSSING_METHOD = "isotonic-trend, overshoot decrement/3, first-evaluation crossings refined"


def calibration_key(cfg: ExperimentConfig, data_fingerprint: str) -> dict:
    """What the statistics of a batch size depend on: the model, the data, the optimiser and
    its LR rule, the noise estimator. Not the hardware, the layout or the seed: one calibration
    serves every cluster and every repeat of the workload."""
    o, s, g = cfg.optimizer, cfg.schedule, cfg.gns
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "calibration",
        "workload": {"model": cfg.workload.model, "seq_len": cfg.workload.seq_len, "data": data_fingerprint},
        "optimizer": {
            "lr": o.lr,
            "reference_gbs": o.reference_gbs,
            "lr_scaling": o.lr_scaling,
            "betas": list(o.betas),
            "eps": o.eps,
            "weight_decay": o.weight_decay,
            "grad_clip": o.grad_clip,
        },
        "schedule": s.model_dump(mode="json"),
        "gns": estimator_key(g),
    }


def estimator_key(g) -> dict:
    """The noise estimator a calibration's c belongs to (c = B_crit / the run's estimate): the
    fixed horizon keeps the key files written before the progress horizon existed, and an
    estimator without outlier weighting those written before it existed."""
    outliers = {"outlier_ratio": g.outlier_ratio} if g.outlier_ratio is not None else {}
    if g.horizon == "fixed":
        return {"smoothing": g.smoothing, "precondition": g.precondition} | outliers
    return {
        "horizon": g.horizon,
        "half_life_share": g.half_life_share,
        "min_half_life": g.min_half_life,
        "precondition": g.precondition,
    } | outliers


def calibration_path(cfg: ExperimentConfig, data_fingerprint: str) -> Location:
    return cfg.resolved_profile_dir() / f"calibration-{key_id(calibration_key(cfg, data_fingerprint))}.json"


def load_calibration(cfg: ExperimentConfig, data_fingerprint: str) -> dict | None:
    """The workload's calibration, if one was made (and its key matches); else None."""
    path = calibration_path(cfg, data_fingerprint)
    if not path.is_file():
        return None
    try:
        data = path.read_json()
    except (UnicodeDecodeError, ValueError) as err:
        data, problem = None, f"not JSON: {type(err).__name__}"
    else:
        problem = calibration_problem(data)
    if problem:
        raise ConfigError(f"{path}: a damaged calibration file ({problem}); run copus calibrate again, or remove it")
    return data if data.get("key") == calibration_key(cfg, data_fingerprint) else None


def check_settings(cfg: ExperimentConfig) -> None:
    """The calibration's grid and branch points, refused with one line naming the field."""
    grid, b0 = cfg.calibration_grid(), cfg.optimizer.reference_gbs
    if len(grid) < 4 or grid[-1] < 16 * grid[0]:
        raise ConfigError(f"calibration.gbs: need at least 4 batch sizes spanning at least 16x, got {grid}")
    bad = [s for s in cfg.calibration_branches() if s <= 0 or s % b0]
    if bad or len(cfg.calibration_branches()) < 2:
        raise ConfigError(
            f"calibration.branch_samples: need at least 2 positive multiples of optimizer.reference_gbs "
            f"({b0}), got {cfg.calibration_branches()}"
        )
    if cfg.optimizer.reference_gbs < 2:
        raise ConfigError(
            "optimizer.reference_gbs: the calibration measures the noise scale at B0, which needs B0 >= 2"
        )


# `copus calibrate --quick`: two seeds per point. On the trade-off workload, the 28 seed pairs of
# its 8-seed calibration gave B_crit within x1.5 of the 8 seeds' in 96% of cases
# (docs/calibration.md, "A quick calibration").
QUICK_SEEDS = 2


def quick_branches(branches: list[int]) -> list[int]:
    """The quick mode's two branch points: not the last (the dearest: the longest reference run,
    and the slowest-falling loss to continue from) and, with four or more, not the first (inside
    the warm-up, where B_crit lies below every batch a run would choose)."""
    if len(branches) <= 2:
        return branches
    kept = branches[1:-1] if len(branches) >= 4 else branches[:-1]
    return kept[:2]


def quick_overrides(cfg: ExperimentConfig) -> list[str]:
    """The `--set` overrides the quick mode stands for, from the experiment's own settings."""
    branches = quick_branches(cfg.calibration_branches())
    return [f"calibration.seeds={QUICK_SEEDS}", f"calibration.branch_samples=[{', '.join(map(str, branches))}]"]


# --- what runs on the Ray workers ---------------------------------------------------------


def trial_cpus(use_gpu: bool, cpus_per_worker: float) -> float:
    """The cores of the reference run and of each continuation, unless calibration.cpus_per_trial
    says: on CPU all of the driver's (a continuation is one process, run one after another); on
    a GPU cluster a training worker's share (cluster.cpus_per_worker), so one runs per GPU."""
    return float(cpus_per_worker) if use_gpu else float(os.cpu_count() or 1)


def task_resources(cpus: float, use_gpu: bool) -> dict:
    """Ray resources of the reference run and of each continuation: its cores and, on a GPU
    cluster, one GPU (a Ray task without one sees no GPU and would train on the CPU)."""
    return {"cpu": cpus, **({"gpu": 1} if use_gpu else {})}


def _use_cores(cpus: float) -> None:
    import torch

    torch.set_num_threads(max(1, int(cpus)))


def _reference_task(
    plan: WorkerPlan, branches: list[int], out_dir: Location, val_samples: int, gns_steps: int, cpus: float
) -> list[dict]:
    """The reference run; its branch checkpoints are written locally and end up in `out_dir`
    (uploaded once the run is done when that is an object store)."""
    from copus.train.calibrate import branch_noise_scales, reference_run

    _use_cores(cpus)
    with staged_directory(out_dir) as local:
        t = time.perf_counter()
        points = reference_run(plan, branches, local, val_samples)
        reference_s = time.perf_counter() - t
        for p in points:
            p.update(branch_noise_scales(plan, Path(p["checkpoint"]), gns_steps))
            p["checkpoint"] = str(out_dir / Path(p["checkpoint"]).name)
        noise_s = time.perf_counter() - t - reference_s
    return [{**p, "reference_run_s": reference_s, "noise_measurement_s": noise_s} for p in points]


def calibration_trial(config: dict, plan: WorkerPlan, settings: dict) -> None:
    """One Ray Tune trial: one continuation (branch point, GBS, seed)."""
    from copus.train.calibrate import continue_branch

    _use_cores(settings["cpus"])
    point = config["point"]
    with local_copy(Location.parse(point["checkpoint"])) as checkpoint:
        result = continue_branch(
            plan,
            checkpoint,
            point["start"],
            point["gbs"],
            point["seed"],
            settings["decrement"],
            settings["max_samples"],
            settings["eval_every_samples"],
            settings["val_samples"],
            point.get("lr_factor", 1.0),
        )
    tune.report({**result, "branch": point["branch"]})


# --- the driver ---------------------------------------------------------------------------


class _Progress(tune.Callback):
    """A line per finished continuation; its point file and MLflow child run."""

    def __init__(self, on_point: Callable[[dict], None]):
        self.on_point = on_point

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.on_point(
            {
                **trial.config["point"],
                **{
                    k: result[k]
                    for k in (
                        "samples",
                        "steps",
                        "reached",
                        "target_val_loss",
                        "wall_clock_s",
                        "curve_samples",
                        "curve_val_loss",
                        "eval_every_samples",
                        "refined",
                        "unmeasurable",
                    )
                },
            }
        )


def _point_name(p: dict) -> str:
    factor = p.get("lr_factor", 1.0)
    return f"b{p['branch']}-gbs{p['gbs']}-s{p['seed']}" + ("" if factor == 1.0 else f"-lr{factor:g}")


def _runs_label(cal: Calibration) -> str:
    extra = len(cal.runs()) - len(cal.settings["gbs"])
    return f"{len(cal.settings['gbs'])} GBS" + (f" (+ {extra} of the LR probe)" if extra else "")


def _lr_label(point: dict) -> str:
    factor = point.get("lr_factor", 1.0)
    return "" if factor == 1.0 else f" (LR x{factor:g})"


def lr_probe_settings(cfg: ExperimentConfig) -> dict:
    """`calibration.lr_probe` as the calibration runs it: the (GBS, LR factor) pairs besides the
    grid, the jump's factor (the rule's LR at jump_to over its LR at B0) included."""
    probe, b0 = cfg.calibration.lr_probe, cfg.optimizer.reference_gbs
    jump_to = probe.jump_to or 4 * b0
    jump = batch_scale(cfg.optimizer.lr_scaling, jump_to, b0)
    pairs = {(g, f) for g in probe.gbs for f in probe.factors} | {(b0, jump)}
    return {"jump_to": jump_to, "jump_factor": jump, "pairs": sorted([g, f] for g, f in pairs if f != 1.0)}


class Calibration:
    """One calibration's state on disk and in MLflow, and the steps that fill it."""

    def __init__(self, cfg: ExperimentConfig, echo: Callable[[str], None]):
        check_settings(cfg)
        self.cfg, self.echo = cfg, echo
        tokens, self.plan = prepare_plan(cfg)
        self.key = calibration_key(cfg, tokens.fingerprint)
        self.path = calibration_path(cfg, tokens.fingerprint)
        c = cfg.calibration
        self.settings = {
            "gbs": cfg.calibration_grid(),
            "branch_samples": cfg.calibration_branches(),
            "decrement": c.decrement,
            "seeds": c.seeds,
            "eval_every_samples": c.eval_every_samples,
            "val_samples": c.validation_samples(
                cfg.eval.val_samples,
                file_windows(tokens.val, tokens.dtype, cfg.workload.seq_len),
            ),
            "max_samples": c.max_samples,
            "gns_steps": c.gns_steps,
            "cpus": c.cpus_per_trial or trial_cpus(cfg.cluster.use_gpu, cfg.cluster.cpus_per_worker),
        }
        # The work folder is keyed by the settings too: other settings, other runs.
        self.work = (
            self.path.parent
            / self.path.name.removesuffix(".json")
            / key_id({**self.settings, "cpus": None, "key": self.key, "crossing": CROSSING_METHOD})
        )
        (self.work / "points").mkdir()
        if c.lr_probe is not None:  # not in the work folder's key: its points add to the grid's
            self.settings["lr_probe"] = lr_probe_settings(cfg)
        self.tracker = Tracker(cfg.resolved_tracking_uri(), cfg.tracking.experiment, warn=echo)
        self.parent: str | None = None

    def branch_points(self) -> list[dict]:
        """The reference run's branch points (run once, kept)."""
        path = self.work / "branches.json"
        if path.is_file():
            return path.read_json()
        s = self.settings
        self.echo(
            f"reference run at gbs {self.cfg.optimizer.reference_gbs} to {max(s['branch_samples'])} samples, "
            f"branching at {s['branch_samples']}"
        )
        needs = task_resources(s["cpus"], self.plan.use_gpu)
        task = ray.remote(_reference_task).options(num_cpus=needs["cpu"], num_gpus=needs.get("gpu", 0))
        points = ray.get(
            task.remote(
                self.plan, s["branch_samples"], self.work / "branches", s["val_samples"], s["gns_steps"], s["cpus"]
            )
        )
        for i, p in enumerate(points):
            self.echo(
                f"  branch {i}: {p['samples']} samples, val loss {p['val_loss']:.3f}, B_noise {p['b_noise']:.1f} "
                f"(Adam {p['b_noise_adam']:.1f}, run's estimate {p['b_noise_run']:.1f})"
            )
        write_json_atomic(path, points)
        return points

    def done(self) -> dict[str, dict]:
        points = (self.work / "points").iterdir()
        return {f.name.removesuffix(".json"): f.read_json() for f in points if f.name.endswith(".json")}

    def record_point(self, point: dict) -> None:
        write_json_atomic(self.work / "points" / f"{_point_name(point)}.json", point)
        total = len(self.runs()) * len(self.settings["branch_samples"]) * self.settings["seeds"]
        reached = (
            f"{point['samples']:.0f} samples ({point['steps']:.1f} steps)"
            if math.isfinite(point["samples"])
            else point.get("unmeasurable") or f"not reached in {self.settings['max_samples']} samples"
        )
        self.echo(
            f"[{len(self.done())}/{total}] branch {point['branch']} (val {point['start']['val_loss']:.3f}) "
            f"gbs {point['gbs']}{_lr_label(point)} seed {point['seed']}: -{self.settings['decrement']} in {reached}, "
            f"{point['wall_clock_s']:.1f} s"
        )
        self._log_child(point)

    def _log_child(self, point: dict) -> None:
        if self.parent is None:
            return
        run = self.tracker.start_run(
            f"calibrate/{_point_name(point)}",
            {"branch": str(point["branch"]), "gbs": str(point["gbs"]), "seed": str(point["seed"])},
            {"kind": "calibration-point"},
            self.parent,
        )
        values = {"samples_to_decrement": point["samples"], "steps_to_decrement": point["steps"]}
        self.tracker.log_values(run, {k: v for k, v in values.items() if math.isfinite(v)}, step=0)
        for s, v in zip(point["curve_samples"], point["curve_val_loss"]):
            self.tracker.log_values(run, {"val_loss": v}, step=int(s))
        self.tracker.finish(run)

    def pending_points(self, branches: list[dict]) -> list[dict]:
        done = self.done()
        points = [
            {
                "branch": i,
                "gbs": g,
                "seed": k,
                "checkpoint": b["checkpoint"],
                "start": {"samples": b["samples"], "val_loss": b["val_loss"]},
                **({} if factor == 1.0 else {"lr_factor": factor}),
            }
            for i, b in enumerate(branches)
            for g, factor in self.runs()
            for k in range(self.settings["seeds"])
        ]
        return [p for p in points if _point_name(p) not in done]

    def runs(self) -> list[tuple[int, float]]:
        """(GBS, LR factor) of every continuation from a branch point: the grid at the rule's LR,
        then the LR probe's pairs."""
        probe = self.settings.get("lr_probe") or {"pairs": []}
        return [(g, 1.0) for g in self.settings["gbs"]] + [(g, f) for g, f in probe["pairs"]]

    def run_trials(self, pending: list[dict]) -> float:
        """The pending continuations as one Ray Tune grid; returns Tune's wall-clock."""
        t = time.time()
        trainable = tune.with_resources(
            tune.with_parameters(calibration_trial, plan=self.plan, settings=self.settings),
            task_resources(self.settings["cpus"], self.plan.use_gpu),
        )
        tuner = tune.Tuner(
            trainable,
            param_space={"point": tune.grid_search(pending)},
            tune_config=tune.TuneConfig(reuse_actors=True),
            run_config=tune.RunConfig(
                name=f"calibrate-{int(t)}",
                **ray_storage_args(self.work / "tune"),
                verbose=0,
                callbacks=[_Progress(self.record_point)],
            ),
        )
        with contextlib.redirect_stdout(sys.stderr):  # Tune's banner: stdout is for --json alone
            grid = tuner.fit()
        missing = [p for p in pending if _point_name(p) not in self.done()]
        if missing and not grid.errors:
            # Tune catches Ctrl-C itself and returns what finished: pass the interrupt on.
            raise KeyboardInterrupt
        if grid.errors:
            raise RuntimeError(f"calibration: {len(grid.errors)} continuation(s) failed; first: {grid.errors[0]}")
        return time.time() - t

    def fit(self, branches: list[dict], wall_clock_s: float) -> dict:
        every = sorted(self.done().values(), key=lambda p: (p["branch"], p["gbs"], p.get("lr_factor", 1.0), p["seed"]))
        points = grid_points(every)
        sweeps = []
        for i, b in enumerate(branches):
            by_gbs = samples_by_gbs(points, i)
            sweeps.append(Sweep(_start_loss(points, i, b), self.settings["decrement"], b["samples"], by_gbs))
        fits = [
            with_noise_scales(fit, b["b_noise"], b["b_noise_adam"], b["b_noise_run"])
            for fit, b in zip(fit_branches(sweeps, self.cfg.optimizer.reference_gbs), branches)
        ]
        result = CalibrationResult(
            self.key,
            self.cfg.optimizer.reference_gbs,
            self.settings["decrement"],
            fits,
            [
                {k: p[k] for k in ("branch", "gbs", "seed", "samples", "steps", "reached")}
                | {
                    "val_loss": p["start"]["val_loss"],
                    "refined": p.get("refined"),
                    "unmeasurable": p.get("unmeasurable"),
                    "lr_factor": p.get("lr_factor", 1.0),
                    # this calibration's compute for it; null for a point taken over from a file
                    "wall_clock_s": None if "imported_from" in p else p["wall_clock_s"],
                }
                for p in every
            ],
            wall_clock_s,
        )
        data = result.as_dict(self.path.name.removesuffix(".json").removeprefix("calibration-"))
        data["settings"] = {**{k: v for k, v in self.settings.items() if k != "cpus"}, "crossing": CROSSING_METHOD}
        if "lr_probe" in self.settings:
            data["lr_probe"] = lr_probe_table(every, self.cfg.optimizer.reference_gbs, self.settings["lr_probe"])
        data["transient"] = transient_table(
            every, data["branch_points"], self.cfg.optimizer.reference_gbs, self.settings["decrement"]
        )
        return finite_json(data)


def _start_loss(points: list[dict], branch: int, b: dict) -> float:
    """The loss a branch's continuations started from: the reference run's there, or, for points
    taken over from another calibration, the loss they were measured from."""
    starts = sorted(p["start"]["val_loss"] for p in points if p["branch"] == branch)
    return starts[len(starts) // 2] if starts else b["val_loss"]


def _take_over_points(cal: Calibration, path: str, echo: Callable[[str], None]) -> dict:
    """`--reuse-points FILE`: FILE's continuations become this calibration's (calibration_reuse)."""
    data = load_reusable(cal.cfg, cal.key, cal.settings, path)
    if data["key"]["workload"].get("data") != cal.key["workload"]["data"]:
        echo(f"{path}: measured on other data of this workload (fingerprint {data['key']['workload'].get('data')})")
    done = cal.done()
    for p in imported_points(data, cal.settings["branch_samples"], path):
        if _point_name(p) not in done:
            write_json_atomic(cal.work / "points" / f"{_point_name(p)}.json", p)
    echo(f"{len(data['points'])} continuations taken over from {path}; only the reference run is repeated")
    return provenance(data, path)


def run_calibration(
    cfg: ExperimentConfig, echo: Callable[[str], None] = print, reuse_points: str | None = None
) -> dict:
    """Measure (or finish measuring) the workload's critical batch; write and return the
    calibration. `reuse_points`: a calibration file whose continuations are taken over."""
    t = time.time()
    cal = Calibration(cfg, echo)
    points_from = _take_over_points(cal, reuse_points, echo) if reuse_points else None
    join_cluster(cfg, echo)
    cal.parent = cal.tracker.start_run(
        f"calibrate: {cfg.name}",
        flatten({"calibration": cal.settings}),
        {"kind": "calibration", "copus.calibration": str(cal.path)},
    )
    try:
        branches = cal.branch_points()
        pending = cal.pending_points(branches)
        echo(
            f"{len(pending)} continuations to run ({len(branches)} branch points x {_runs_label(cal)} "
            f"x {cal.settings['seeds']} seeds; {sum(1 for _ in cal.done())} already done)"
        )
        tune_s = cal.run_trials(pending) if pending else 0.0
        data = cal.fit(branches, time.time() - t)
        data["tune_overhead_s_per_trial"] = _overhead(tune_s, pending, cal.done())
        if points_from is not None:
            data["settings"]["points_from"] = points_from
        data.update(calibration_cost(branches, cal.done()))
    except BaseException:
        cal.tracker.finish(cal.parent, "KILLED")
        raise
    _say_replaced(cal.path, data, echo)
    write_json_atomic(cal.path, data)
    _log_parent(cal, data)
    data["path"] = str(cal.path)
    return data


def _say_replaced(path: Location, data: dict, echo: Callable[[str], None]) -> None:
    """One line when the calibration written replaces one that measured more (a --quick one
    over a full one, say): the runs of the workload read only the newest."""
    if not path.is_file():
        return
    try:
        before = len(path.read_json().get("points") or [])
    except (UnicodeDecodeError, ValueError, AttributeError):
        return
    if before > len(data["points"]):
        echo(f"{path}: replaces a calibration of {before} continuations with this one of {len(data['points'])}")


def calibration_cost(branches: list[dict], done: dict[str, dict]) -> dict:
    """What the calibration cost in compute, as seconds and as a multiple of its reference run
    (a run of the workload at B0 to the last branch point: the closest thing to "one run" it
    measures itself). Points taken over from another calibration cost nothing here."""
    reference_s = branches[0].get("reference_run_s") if branches else None
    if reference_s is None:  # branch points made before this was recorded
        return {"reference_run_s": None, "cost_s": None, "cost_in_reference_runs": None}
    cost = reference_s + branches[0].get("noise_measurement_s", 0.0) + sum(p["wall_clock_s"] for p in done.values())
    return {"reference_run_s": reference_s, "cost_s": cost, "cost_in_reference_runs": cost / reference_s}


def _overhead(tune_s: float, pending: list[dict], done: dict[str, dict]) -> float | None:
    """Tune's own time per trial: its wall-clock less the continuations' own."""
    if not pending:
        return None
    own = sum(done[_point_name(p)]["wall_clock_s"] for p in pending if _point_name(p) in done)
    return (tune_s - own) / len(pending)


def _log_parent(cal: Calibration, data: dict) -> None:
    for i, b in enumerate(data["branch_points"]):
        values = {
            f"{k}.b{i}": b[k]
            for k in (
                "val_loss",
                "b_crit",
                "b_crit_low",
                "b_crit_high",
                "b_crit_raw",
                "b_noise",
                "b_noise_adam",
                "b_noise_run",
                "c",
                "chi2_p",
            )
            if b[k] is not None
        }
        cal.tracker.log_values(cal.parent, values, step=0)
    cal.tracker.log_dict(cal.parent, data, "calibration.json")
    cal.tracker.set_tags(cal.parent, {"all_fits_ok": data["all_fits_ok"]})
    cal.tracker.finish(cal.parent)


def _lr_probe_lines(probe: dict | None) -> list[str]:
    if not probe:
        return []
    f = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    lines = ["LR probe: samples to the decrement at (GBS, LR x factor), relative to the rule's LR at that GBS"]
    for r in probe["rows"]:
        lines.append(
            f"  branch {r['branch']} gbs {r['gbs']} LR x{r['lr_factor']:g}: {f(r['mean_samples'], '.0f')} "
            f"({f(r['relative_to_rule'], '.2f')} of the rule's {f(r['rule_samples'], '.0f')})"
        )
    for j in probe["jumps"]:
        lines.append(
            f"  branch {j['branch']} LR jump to gbs {probe['jump_to']}'s (x{probe['jump_factor']:.2f}) at B0: "
            f"{f(j['samples_b0_jumped_lr'], '.0f')} samples against {f(j['samples_b0'], '.0f')} at B0 and "
            f"{f(j['samples_jump_to'], '.0f')} at {probe['jump_to']}: LR share of the switch "
            f"{f(j['lr_share_of_switch'], '.2f')}"
        )
    return lines


def _transient_lines(transient: list[dict] | None) -> list[str]:
    if not transient:
        return []
    f = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    lines = ["switch transient: share of the decrement's samples its first half took, against B0's (no switch)"]
    for t in transient:
        lines.append(
            f"  branch {t['branch']}: B_crit first half {f(t['b_crit_first'], '.1f')} "
            f"({f(t['b_crit_first_low'], '.1f')}..{f(t['b_crit_first_high'], '.1f')}), late half "
            f"{f(t['b_crit_late'], '.1f')} ({f(t['b_crit_late_low'], '.1f')}..{f(t['b_crit_late_high'], '.1f')}); "
            f"growth over half a decrement alone x{f(t['growth_expected'], '.2f')}"
        )
        for r in t["rows"]:
            lines.append(
                f"    gbs {r['gbs']}: first half {f(r['first_half_share'], '.0%')} of E(B) against "
                f"{f(r['first_half_share_b0'], '.0%')} at B0, gap {f(r['share_gap'], '+.2f')} "
                f"({f(r['share_gap_low'], '+.2f')}..{f(r['share_gap_high'], '+.2f')}; {r['seeds']}/{r['seeds_b0']} "
                f"seeds): {f(r['transient_samples'], '.0f')} samples ({f(r['transient_share'], '.0%')} of E(B))"
            )
    return lines


def calibration_table(data: dict) -> str:
    lines = [
        f"{'branch':>6} {'samples':>8} {'val loss':>8} {'B_crit':>8} {'95% interval':>17} {'fit p':>6} "
        f"{'B_noise':>8} {'Adam':>8} {'run':>8} {'c':>6}"
    ]
    f = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    for i, b in enumerate(data["branch_points"]):
        lines.append(
            f"{i:>6} {b['samples_seen']:>8} {b['val_loss']:>8.3f} {f(b['b_crit'], '8.1f')} "
            f"{f(b['b_crit_low'], '7.1f')}..{f(b['b_crit_high'], '<8.1f')} {f(b['chi2_p'], '6.2f')} "
            f"{f(b['b_noise'], '8.1f')} {f(b['b_noise_adam'], '8.1f')} {f(b['b_noise_run'], '8.1f')} "
            f"{f(b['c'], '6.1f')}" + ("" if b["fit_ok"] else "  (linear form rejected: measured curve used)")
        )
        lines.append(
            f"{'':>6} E(B) samples: " + ", ".join(f"{g}: {e:.0f}" for g, e in zip(b["gbs"], b["mean_samples"]))
        )
    lines += _lr_probe_lines(data.get("lr_probe"))
    lines += _transient_lines(data.get("transient"))
    if data.get("cost_in_reference_runs") is not None:
        lines.append(
            f"cost: {data['cost_s']:.0f} s of compute, {data['cost_in_reference_runs']:.1f}x its reference run "
            f"({data['reference_run_s']:.0f} s)"
        )
    lines.append(f"calibration: {data.get('path', '')}")
    return "\n".join(lines)
