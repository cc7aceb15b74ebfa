"""`copus compare SUITE.yaml`: one experiment under several policies, one after another on
the same cluster, as child MLflow runs of one parent run; OUTPUT_DIR/comparison.json holds
each policy's time to target and COPUS's speedup over the fastest baseline.

Every run starts fresh in OUTPUT_DIR/<policy>/r<repeat>; all share one profile table
(OUTPUT_DIR/profiles unless the experiment names a table_dir), so the search space is
profiled once. comparison.json is rewritten (atomically) after every run: an interrupted
suite keeps what finished.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from copus.cluster.driver import run_experiment
from copus.config import SuiteConfig, config_from_mapping
from copus.core.comparison import summarize
from copus.run_state import write_json_atomic
from copus.tracking import Tracker, flatten


def suite_table_dir(suite: SuiteConfig, base) -> str:
    """Where a suite's runs keep (and look for) the profile table and the calibration: the
    experiment's table_dir when it names one, else OUTPUT_DIR/profiles of the suite."""
    out = Path(suite.output_dir).expanduser().resolve()
    return str(base.resolved_profile_dir()) if base.profile.table_dir else str(out / "profiles")


def run_comparison(suite: SuiteConfig, experiment: dict, overrides: list[str],
                   echo: Callable[[str], None] = print) -> dict:
    out = Path(suite.output_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    base = config_from_mapping(experiment, suite.set + overrides)
    table_dir = suite_table_dir(suite, base)
    tracker = Tracker(base.resolved_tracking_uri(), base.tracking.experiment)
    parent = tracker.start_run(f"compare: {suite.name}", flatten({"suite": suite.model_dump(mode="json")}),
                               {"kind": "comparison", "copus.output_dir": str(out)})
    runs: list[dict] = []
    result: dict = {}
    try:
        for repeat in range(suite.repeats):
            for i, policy in enumerate(suite.policies):
                seed = base.workload.seed + (repeat if suite.seeds == "same" else repeat * len(suite.policies) + i)
                run_dir = out / policy / f"r{repeat}"
                cfg = config_from_mapping(experiment, suite.set + overrides + [
                    f"policy.name={policy}", f"workload.seed={seed}", f"output_dir={run_dir}",
                    f"tracking.run_name={suite.name}/{policy}/r{repeat}", f"profile.table_dir={table_dir}",
                    *(["policy.layout=best"] if policy == "static" and suite.static_layout == "best" else [])])
                echo(f"== {suite.name}: {policy}, repeat {repeat + 1}/{suite.repeats}, seed {seed}")
                summary = run_experiment(cfg, fresh=True, echo=echo, parent_run_id=parent)
                runs.append({"policy": policy, "repeat": repeat, "seed": seed,
                             "time_to_target_s": summary["time_to_target_s"], "reached_target": summary["reached_target"],
                             "final_val_loss": summary["final_val_loss"], "samples": summary["samples"],
                             "reconfigurations": len(summary["reconfigurations"]), "wall_clock_s": summary["wall_clock_s"],
                             "initial_layout": summary["initial_layout"], "final_layout": summary["layout"],
                             "mlflow_run_id": summary["mlflow_run_id"], "output_dir": summary["output_dir"]})
                result = {"suite": suite.name, "experiment": base.name, "target_val_loss": base.stop.target_val_loss,
                          "mlflow_parent_run_id": parent, "mlflow_tracking_uri": tracker.uri,
                          "policies": summarize(runs, suite.policies), "runs": runs}
                write_json_atomic(out / "comparison.json", result)
    except BaseException:
        tracker.finish(parent, "FAILED")
        raise
    for policy, stats in result["policies"].items():
        values = {f"time_to_target_s.{policy}": stats["time_to_target_s"], f"final_val_loss.{policy}": stats["final_val_loss"]}
        tracker.log_values(parent, {k: v for k, v in values.items() if v is not None}, step=0)
    speedup = result["policies"].get("copus", {}).get("speedup_vs_fastest_baseline")
    if speedup is not None:
        tracker.log_values(parent, {"speedup_vs_fastest_baseline": speedup}, step=0)
    tracker.log_dict(parent, result, "comparison.json")
    tracker.finish(parent)
    result["output_dir"] = str(out)
    echo(comparison_table(result))
    return result


def comparison_table(result: dict) -> str:
    lines = [f"{'policy':<16} {'reached':>7} {'time to target s':>17} {'final val':>9} {'samples':>8} {'reconfigs':>9}"]
    for policy, s in result["policies"].items():
        ttt = "-" if s["time_to_target_s"] is None else f"{s['time_to_target_s']:.1f}" + (
            f" ± {s['time_to_target_std_s']:.1f}" if s["runs"] > 1 else "")
        lines.append(f"{policy:<16} {s['reached']:>3}/{s['runs']:<3} {ttt:>17} {s['final_val_loss']:>9.4f} "
                     f"{s['samples']:>8.0f} {s['reconfigurations']:>9.1f}")
    copus = result["policies"].get("copus")
    if copus and copus.get("speedup_vs_fastest_baseline") is not None:
        lines.append(f"copus vs fastest baseline ({copus['fastest_baseline']}): {copus['speedup_vs_fastest_baseline']:+.1%}")
        ci = copus.get("paired_speedup_ci95")
        if ci is not None:
            per = ", ".join(f"{x:+.1%}" for x in copus["paired_speedup_per_repeat"])
            lines.append(f"  paired by repeat: mean {copus['paired_speedup_mean']:+.1%}, 95% CI {ci[0]:+.1%} .. "
                         f"{ci[1]:+.1%} ({per})")
    lines.append(f"comparison: {Path(result['runs'][0]['output_dir']).parents[1] / 'comparison.json'}")
    return "\n".join(lines)
