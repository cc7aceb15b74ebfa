"""`copus compare SUITE.yaml`: one experiment under several policies, one after another on
the same cluster, as child MLflow runs of one parent run; OUTPUT_DIR/comparison.json holds
each policy's time to target and COPUS's speedup over the fastest baseline.

Every run starts fresh in OUTPUT_DIR/<policy>/r<repeat>; all share one profile table
(OUTPUT_DIR/profiles unless the experiment names a table_dir), so the search space is
profiled once. comparison.json is rewritten (atomically) after every run: an interrupted
suite keeps what finished.
"""

from __future__ import annotations

from typing import Callable

from copus.cluster.driver import run_experiment
from copus.config import SuiteConfig, config_from_mapping
from copus.core.comparison import run_order, summarize
from copus.core.layout import CandidateConfig
from copus.core.policy_names import ADAPTIVE
from copus.storage import Location, write_json_atomic
from copus.tracking import Tracker, flatten


def suite_table_dir(suite: SuiteConfig, base) -> str:
    """Where a suite's runs keep (and look for) the profile table and the calibration: the
    experiment's table_dir when it names one, else OUTPUT_DIR/profiles of the suite."""
    out = Location.parse(suite.output_dir)
    return str(base.resolved_profile_dir()) if base.profile.table_dir else str(out / "profiles")


def run_comparison(
    suite: SuiteConfig, experiment: dict, overrides: list[str], echo: Callable[[str], None] = print
) -> dict:
    out = Location.parse(suite.output_dir)
    out.mkdir()
    base = config_from_mapping(experiment, suite.set + overrides)
    table_dir = suite_table_dir(suite, base)
    tracker = Tracker(base.resolved_tracking_uri(), base.tracking.experiment)
    parent = tracker.start_run(
        f"compare: {suite.name}",
        flatten({"suite": suite.model_dump(mode="json")}),
        {"kind": "comparison", "copus.output_dir": str(out)},
    )
    runs: list[dict] = []
    result: dict = {}
    try:
        orders = [
            run_order(suite.policies, r, suite.order_seed, suite.order == "shuffled") for r in range(suite.repeats)
        ]
        for repeat, order in enumerate(orders):
            for position, policy in enumerate(order):
                i = suite.policies.index(policy)
                seed = base.workload.seed + (repeat if suite.seeds == "same" else repeat * len(suite.policies) + i)
                cfg = _policy_config(
                    suite, experiment, overrides, policy, repeat, seed, out / policy / f"r{repeat}", table_dir
                )
                echo(f"== {suite.name}: {policy}, repeat {repeat + 1}/{suite.repeats}, seed {seed}")
                summary = run_experiment(cfg, fresh=True, echo=echo, parent_run_id=parent)
                runs.append({**_run_row(policy, repeat, seed, summary), "position": position})
                result = {
                    "suite": suite.name,
                    "experiment": base.name,
                    "target_val_loss": base.stop.target_val_loss,
                    "mlflow_parent_run_id": parent,
                    "mlflow_experiment_id": tracker.experiment_id,
                    "mlflow_view_key": f"compare-{parent}",
                    "mlflow_tracking_uri": tracker.uri,
                    "policies": summarize(runs, suite.policies),
                    "run_order": {"order": suite.order, "order_seed": suite.order_seed, "repeats": orders},
                    "runs": runs,
                }
                write_json_atomic(out / "comparison.json", result)
    except BaseException:
        tracker.finish(parent, "FAILED")
        raise
    _log_to_parent(tracker, parent, suite, result)
    result["output_dir"] = str(out)
    echo(comparison_table(result))
    return result


def _policy_config(
    suite: SuiteConfig,
    experiment: dict,
    overrides: list[str],
    policy: str,
    repeat: int,
    seed: int,
    run_dir: Location,
    table_dir: str,
):
    """One run of the suite: the experiment with the suite's settings, the policy, its seed, its own
    output directory and MLflow name, and the suite's shared profile table."""
    return config_from_mapping(
        experiment,
        suite.set
        + overrides
        + [
            f"policy.name={policy}",
            f"workload.seed={seed}",
            f"output_dir={run_dir}",
            f"tracking.run_name={suite.name}/{policy}/r{repeat}",
            f"profile.table_dir={table_dir}",
            *(["policy.layout=best"] if policy == "static" and suite.static_layout == "best" else []),
        ],
    )


def _run_row(policy: str, repeat: int, seed: int, summary: dict) -> dict:
    """comparison.json's entry for one run, cut from its summary.json."""
    return {
        "policy": policy,
        "repeat": repeat,
        "seed": seed,
        "time_to_target_s": summary["time_to_target_s"],
        "time_to_target_without_eval_s": summary.get("time_to_target_without_eval_s"),
        "reached_target": summary["reached_target"],
        "final_val_loss": summary["final_val_loss"],
        "samples": summary["samples"],
        "reconfigurations": len(summary["reconfigurations"]),
        "wall_clock_s": summary["wall_clock_s"],
        "initial_layout": summary["initial_layout"],
        "final_layout": summary["layout"],
        "mlflow_run_id": summary["mlflow_run_id"],
        "output_dir": summary["output_dir"],
    }


def _log_to_parent(tracker: Tracker, parent: str, suite: SuiteConfig, result: dict) -> None:
    """The finished suite on its MLflow parent run: per-policy figures, speedups, final configurations,
    the comparison file, a name that says the outcome, and the shared results view."""
    for policy, stats in result["policies"].items():
        values = {
            f"time_to_target_s.{policy}": stats["time_to_target_s"],
            f"final_val_loss.{policy}": stats["final_val_loss"],
        }
        tracker.log_values(parent, {k: v for k, v in values.items() if v is not None}, step=0)
    tracker.log_values(parent, speedup_metrics(result["policies"]), step=0)
    tracker.set_tags(parent, final_configs(result["runs"]))
    tracker.log_dict(parent, result, "comparison.json")
    tracker.rename(parent, f"compare: {suite.name} | {speedup_phrase(result['policies'])}")
    tracker.finish(parent)
    tracker.share_view(result["mlflow_view_key"], comparison_columns(suite.policies))


def speedup_metrics(policies: dict) -> dict[str, float]:
    """The parent run's speedup metrics: copus's under the plain names, the ablation's suffixed."""
    out = {}
    for policy in ADAPTIVE:
        s = policies.get(policy, {})
        suffix = "" if policy == "copus" else f".{policy}"
        for key in ("speedup_vs_fastest_baseline", "paired_speedup_mean"):
            if s.get(key) is not None:
                out[key + suffix] = s[key]
    ablation = policies.get("copus", {}).get("vs_copus_gbs") or {}
    if ablation.get("paired_speedup_mean") is not None:
        out["paired_speedup_vs_copus_gbs"] = ablation["paired_speedup_mean"]
    return out


def final_configs(runs: list[dict]) -> dict[str, str]:
    """Parent-run tags: where each policy's runs ended, the most frequent final configuration."""
    out = {}
    for policy in dict.fromkeys(r["policy"] for r in runs):
        labels = [CandidateConfig.from_dict(r["final_layout"]).label() for r in runs if r["policy"] == policy]
        top = max(set(labels), key=labels.count)
        out[f"final_config.{policy}"] = f"{top} ({labels.count(top)}/{len(labels)})"
    return out


def comparison_columns(policies: list[str]) -> list[str]:
    """The columns of a comparison's shared MLflow view: its parent run's figures per policy."""
    speedups = [
        f"metrics.`{key}{'' if p == 'copus' else '.' + p}`"
        for p in ADAPTIVE
        if p in policies
        for key in ("speedup_vs_fastest_baseline", "paired_speedup_mean")
    ]
    return (
        speedups
        + [f"metrics.`time_to_target_s.{p}`" for p in policies]
        + [f"tags.`final_config.{p}`" for p in policies]
    )


def speedup_phrase(policies: dict) -> str:
    """The comparison's outcome in a few words, for its MLflow run name."""
    copus = policies.get("copus", {})
    if copus.get("speedup_vs_fastest_baseline") is None:
        return "no speedup (a target missed)" if "copus" in policies else "baselines only"
    ci = copus.get("paired_speedup_ci95")
    interval = f" (paired 95% CI {ci[0]:+.0%}..{ci[1]:+.0%})" if ci else ""
    return f"copus {copus['speedup_vs_fastest_baseline']:+.1%} vs {copus['fastest_baseline']}{interval}"


def comparison_table(result: dict) -> str:
    lines = [f"{'policy':<16} {'reached':>7} {'time to target s':>17} {'final val':>9} {'samples':>8} {'reconfigs':>9}"]
    for policy, s in result["policies"].items():
        ttt = (
            "-"
            if s["time_to_target_s"] is None
            else f"{s['time_to_target_s']:.1f}" + (f" ± {s['time_to_target_std_s']:.1f}" if s["runs"] > 1 else "")
        )
        lines.append(
            f"{policy:<16} {s['reached']:>3}/{s['runs']:<3} {ttt:>17} {s['final_val_loss']:>9.4f} "
            f"{s['samples']:>8.0f} {s['reconfigurations']:>9.1f}"
        )
    for policy in ADAPTIVE:
        s = result["policies"].get(policy)
        if s and s.get("speedup_vs_fastest_baseline") is not None:
            lines.append(
                f"{policy} vs fastest baseline ({s['fastest_baseline']}): {s['speedup_vs_fastest_baseline']:+.1%}"
            )
            lines += paired_lines(s)
    ablation = result["policies"].get("copus", {}).get("vs_copus_gbs")
    if ablation and ablation.get("paired_speedup_mean") is not None:
        lines.append("copus vs copus-gbs (the layout and MBS co-adapted):")
        lines += paired_lines(ablation)
    # A run's output_dir is SUITE_DIR/<policy>/r<repeat> (a path or URI; its query is left out here).
    suite_dir = result["runs"][0]["output_dir"].partition("?")[0].rsplit("/", 2)[0]
    lines.append(f"comparison: {suite_dir}/comparison.json")
    return "\n".join(lines)


def paired_lines(s: dict) -> list[str]:
    """The paired-by-repeat speedup line of a comparison entry, when it has an interval."""
    ci = s.get("paired_speedup_ci95")
    if ci is None:
        return []
    per = ", ".join(f"{x:+.1%}" for x in s["paired_speedup_per_repeat"])
    return [f"  paired by repeat: mean {s['paired_speedup_mean']:+.1%}, 95% CI {ci[0]:+.1%} .. {ci[1]:+.1%} ({per})"]
