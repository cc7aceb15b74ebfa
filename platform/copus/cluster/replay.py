"""A run's decisions replayed: its records (OUTPUT_DIR/records.jsonl) fed, in order, to a fresh
Goodput controller built from the run's experiment and profile table, with rank 0's question
for a decision at each step boundary, as the run asked it. The controller decides from the
records alone (their wall-clock times included), so the replay's decisions are the run's own:

    .venv/bin/python -m copus.cluster.replay EXPERIMENT RUN_DIR --table PROFILE [--set KEY=VALUE ...]

prints whether the replayed decisions equal those the run's summary.json recorded (exit 0), or
the first that differs (exit 1). It shows that a change to the controller's code leaves its
decisions as they were (docs/controller.md), or, with `--set`, what another rule would have
decided on the same records (a decision that would have moved the run is shown, but the run
did not move, so what follows it is what the run did, not what the other rule would have).

A probe cannot be replayed (it trained beside the run and its measurement is in no record): a
replay stops at the first branch checkpoint and says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from copus.cluster.controller import Controller
from copus.cluster.controller_setup import controller_spec
from copus.cluster.probes import ProbeSource
from copus.cluster.profile_table import ProfileTable
from copus.config import ExperimentConfig, load_config
from copus.core.finite import finite_json
from copus.train.worker_plan import plan_from_config


@dataclass
class Replay:
    evaluations: list[dict]  # the replayed controller's decisions, as summary.json keeps them
    records: int  # records fed
    stopped_at_probe: int | None  # the step of a branch checkpoint the replay stopped at


def replay_records(cfg: ExperimentConfig, table: ProfileTable, records: list[dict], calibration=None) -> Replay:
    """Feed `records` to a controller built as the run's was (its calibration, if it read one)."""
    spec = controller_spec(cfg, table, table.step_time_model(cfg.flavour().shape()), calibration)
    # What a probe would train from: never used, a replay stops before a probe starts.
    source = ProbeSource(plan_from_config(cfg, "", "", "uint16"), cfg.resolved_output_dir())
    controller = Controller(spec, None, source)
    at_boundary, fed = False, 0
    for record in records:
        kind = record.get("kind")
        if kind == "probe":  # the controller's own records, never pushed to it
            continue
        if kind == "checkpoint" and record.get("branch"):
            return Replay(_as_recorded(controller), fed, record.get("step"))
        if at_boundary and kind in ("step", "reconfigure"):
            controller.decision()  # rank 0's question before the next step
            at_boundary = False
        controller.push(record)
        fed += 1
        at_boundary = at_boundary or kind == "step"
    return Replay(_as_recorded(controller), fed, None)


def _as_recorded(controller: Controller) -> list[dict]:
    """The decisions as summary.json has them (JSON, non-finite numbers as null)."""
    return json.loads(json.dumps(finite_json(controller.snapshot()["evaluations"])))


def first_difference(replayed: list[dict], recorded: list[dict]) -> str | None:
    """Where the replayed decisions part from the recorded ones, in one line; None when equal."""
    for i, (a, b) in enumerate(zip(replayed, recorded)):
        if a != b:
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            return f"decision {i} (step {b.get('step')}) differs in {', '.join(keys)}"
    if len(replayed) != len(recorded):
        return f"{len(replayed)} decisions replayed, {len(recorded)} recorded"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", help="the run's experiment YAML")
    parser.add_argument("run_dir", type=Path, help="the run's output directory (records.jsonl, summary.json)")
    parser.add_argument("--table", type=Path, required=True, help="the profile table the run read (profile-*.json)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override (repeatable)")
    args = parser.parse_args(argv)
    summary = json.loads((args.run_dir / "summary.json").read_text())
    cfg = load_config(args.experiment, [f"policy.name={summary['policy']}", *args.set])
    table = ProfileTable.load(args.table)
    lines = (args.run_dir / "records.jsonl").read_text().splitlines()
    replay = replay_records(cfg, table, [json.loads(line) for line in lines if line.strip()])
    recorded = summary["controller"]["evaluations"]
    if replay.stopped_at_probe is not None:
        print(f"stopped at the branch checkpoint of step {replay.stopped_at_probe}: a probe cannot be replayed")
        recorded = recorded[: len(replay.evaluations)]
    diff = first_difference(replay.evaluations, recorded)
    switches = sum(1 for e in replay.evaluations if e.get("switch"))
    print(
        f"replayed {replay.records} records: {len(replay.evaluations)} decisions, {switches} switch(es); "
        + ("identical to the run's" if diff is None else f"not the run's: {diff}")
    )
    return 0 if diff is None else 1


if __name__ == "__main__":
    sys.exit(main())
