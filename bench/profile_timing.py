"""How a profile times a step against what a training run pays for it.

For each configuration asked for, in one sitting on the experiment's cluster (an emulated one is
brought up once and shared):
- `copus profile` of that configuration (its GBS and twice it, the two points the step-time model
  needs) with `profile.timing=barrier` (each step from a barrier to its end) and with
  `profile.timing=continuous` (steps back to back, each from its start to the next one's);
- a static `copus run` in that configuration for `--run-steps` steps (evaluation and checkpoints
  out of the way): the median of its step records' `step_time_s` and the median gap between
  consecutive steps' wall clocks (what the run's throughput is).
The ratios are each profile's step time over the run's gap.

    .venv/bin/python bench/profile_timing.py experiments/emulated_layout_long.yaml \\
        --configs dp1-tp1-pp2-mbs1-gbs4 dp1-tp1-pp2-mbs2-gbs12 dp2-tp1-pp1-mbs8-gbs16   # ~8 min; root
    .venv/bin/python bench/profile_timing.py --smoke        # the quickstart, one configuration

The last line reads `continuous/run xA (range), barrier/run xB (range) over N configurations`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import statistics
import tempfile
from pathlib import Path

from smoke import parse_args

CONFIG = re.compile(r"dp(\d+)-tp(\d+)-pp(\d+)-mbs(\d+)-gbs(\d+)")


def _copus(args: list[str]) -> str:
    """Run a copus command in this process (one Ray instance serves them all); its stdout."""
    from copus.cli import main as copus_main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = copus_main(args)
    if code != 0:
        raise SystemExit(f"copus {args[0]} failed with exit code {code}")
    return out.getvalue()


def _shape_sets(dp: int, tp: int, pp: int, mbs: int, gbs: int) -> list[str]:
    from copus.core.tuning import layout_overrides

    return [
        *layout_overrides((dp, tp, pp)),
        f"batch.mbs={mbs}",
        f"batch.gbs={gbs}",
        "batch.ramp=null",
        f"search.layouts=[[{dp},{tp},{pp}]]",
        f"search.mbs=[{mbs}]",
        f"search.gbs_min={gbs}",
        f"search.gbs_max={2 * gbs}",
    ]


def profiled_step_s(experiment: str, shape: tuple, timing: str, steps: int, out: Path) -> float:
    sets = [*_shape_sets(*shape), f"profile.timing={timing}", f"profile.steps={steps}", "profile.budget_s=300"]
    sets += [f"output_dir={out}", "tracking.experiment=profile-timing-bench"]
    result = json.loads(_copus(["profile", experiment, "--json", *[f"--set={s}" for s in sets]]))
    table = json.loads(Path(result["table"]).read_text())
    (row,) = [r for r in table["rows"] if (r["dp"], r["tp"], r["pp"], r["mbs"], r["gbs"]) == shape]
    return row["step_time_s"]


def run_step_s(experiment: str, shape: tuple, steps: int, out: Path) -> tuple[float, float]:
    """(median step_time_s, median gap between consecutive steps) of a static run."""
    sets = [*_shape_sets(*shape), "policy.name=static", f"stop.max_steps={steps}", "stop.target_val_loss=null"]
    sets += ["stop.max_wall_clock_s=null", f"eval.every_steps={steps + 1}", f"checkpoint.every_steps={steps + 1}"]
    sets += [f"output_dir={out}", "tracking.experiment=profile-timing-bench"]
    _copus(["run", experiment, "--fresh", *[f"--set={s}" for s in sets]])
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines() if line.strip()]
    steps_ = [r for r in records if r.get("kind") == "step"][2:]  # past the first steps' warm-up
    clocks = [r["wall_clock_s"] for r in steps_]
    return statistics.median(r["step_time_s"] for r in steps_), statistics.median(
        b - a for a, b in zip(clocks, clocks[1:])
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", nargs="?", default="experiments/emulated_layout_long.yaml")
    parser.add_argument("--configs", nargs="+", default=["dp1-tp1-pp2-mbs1-gbs4", "dp2-tp1-pp1-mbs8-gbs16"])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per profile point")
    parser.add_argument("--run-steps", type=int, default=200)
    args = parse_args(
        parser,
        {
            "experiment": "experiments/quickstart.yaml",
            "configs": ["dp2-tp1-pp1-mbs8-gbs16"],
            "steps": 2,
            "run_steps": 12,
        },
    )
    shapes = []
    for c in args.configs:
        m = CONFIG.fullmatch(c)
        if m is None:
            raise SystemExit(f"--configs: {c!r}: expected dpD-tpT-ppP-mbsM-gbsG")
        shapes.append(tuple(int(x) for x in m.groups()))
    rows = measure(args, shapes)
    report(rows)


def measure(args, shapes: list[tuple]) -> list[dict]:
    from copus.config import load_config

    cfg = load_config(args.experiment)
    rows = []
    with _cluster(cfg), tempfile.TemporaryDirectory(prefix="copus-timing-") as tmp:
        for i, shape in enumerate(shapes):
            row = {"config": "dp{}-tp{}-pp{} mbs{} gbs{}".format(*shape)}
            for timing in ("barrier", "continuous"):
                row[timing] = profiled_step_s(args.experiment, shape, timing, args.steps, Path(tmp) / f"p{i}{timing}")
            row["run_step"], row["run_gap"] = run_step_s(args.experiment, shape, args.run_steps, Path(tmp) / f"r{i}")
            print(
                f"  {row['config']}: profile barrier {row['barrier']:.4f} s, continuous {row['continuous']:.4f} s; "
                f"run step {row['run_step']:.4f} s, gap {row['run_gap']:.4f} s",
                flush=True,
            )
            rows.append(row)
    return rows


@contextlib.contextmanager
def _cluster(cfg):
    """The experiment's emulated cluster, up once for every command of the bench; nothing otherwise."""
    if cfg.cluster.emulate is None:
        yield
        return
    from copus.cluster import emulate

    problem = emulate.requirements_problem()
    if problem:
        raise SystemExit(f"profile_timing: {problem}")
    with emulate.emulated_cluster(emulate.EmulatedSpec.from_config(cfg)):
        yield


def report(rows: list[dict]) -> None:
    ratios = {t: [r[t] / r["run_gap"] for r in rows] for t in ("continuous", "barrier")}
    for r, continuous, barrier in zip(rows, ratios["continuous"], ratios["barrier"]):
        print(f"  {r['config']}: continuous/run x{continuous:.2f}, barrier/run x{barrier:.2f}")
    parts = [f"{t}/run x{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" for t, v in ratios.items()]
    print(f"{', '.join(parts)} over {len(rows)} configurations")


if __name__ == "__main__":
    main()
