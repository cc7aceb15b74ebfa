"""`copus compare SUITE.yaml`: one experiment under several policies, one after another on
the same cluster, as child MLflow runs of one parent run; OUTPUT_DIR/comparison.json holds
each policy's time to target and COPUS's speedup over the fastest baseline.

Every run starts fresh in OUTPUT_DIR/<policy>/r<repeat>; all share one profile table
(OUTPUT_DIR/profiles unless the experiment names a table_dir), so the search space is
profiled once. comparison.json is rewritten (atomically) after every run: an interrupted
suite keeps what finished. Once a repeat's copus-family run and its static run have both finished,
the copus run's first change of GBS is audited against static, its counterfactual
(`counterfactual_audit` in its entry of `runs`; `copus.core.comparison`).

A suite with `tune` first runs its tuning candidates on the tuning seeds (OUTPUT_DIR/tuning/),
chooses the tuned baselines (`copus.core.tuning`) and writes that choice to comparison.json
before the first evaluation run starts; the winners then run beside the policies as the entries
`tuned-static` / `tuned-ramp` on the evaluation seeds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from copus.cluster.compare_resume import ResumePoint, resume_point, suite_fingerprint
from copus.cluster.driver import run_experiment
from copus.cluster.run_state import read_records_log
from copus.config import (
    ConfigError,
    ExperimentConfig,
    SuiteConfig,
    apply_overrides,
    config_from_mapping,
    tuning_candidates,
)
from copus.core.comparison import (
    add_counterfactual_audits,
    best_baseline,
    log_ratio_text,
    paired_speedup_text,
    run_order,
    share_interval_text,
    sides_text,
    summarize,
)
from copus.core.layout import CandidateConfig
from copus.core.policy_names import ADAPTIVE
from copus.core.tuning import CHOICE_RULE, TuningCandidate, candidate_result, choose_tuned
from copus.storage import Location, write_json_atomic
from copus.tracking import Tracker, flatten


def suite_table_dir(suite: SuiteConfig, base) -> str:
    """Where a suite's runs keep (and look for) the profile table and the calibration: the
    experiment's table_dir when it names one, else OUTPUT_DIR/profiles of the suite."""
    out = Location.parse(suite.output_dir)
    return str(base.resolved_profile_dir()) if base.profile.table_dir else str(out / "profiles")


@dataclass(frozen=True)
class _Suite:
    """What every run of one `copus compare` shares: the suite, its experiment and overrides, the
    validated base, where outputs and the profile table go, the MLflow parent run."""

    suite: SuiteConfig
    experiment: dict
    overrides: list[str]
    base: ExperimentConfig
    out: Location
    table_dir: str
    tracker: Tracker
    parent: str
    echo: Callable[[str], None]
    fingerprint: str = ""  # copus.cluster.compare_resume.suite_fingerprint
    resume: ResumePoint = field(default_factory=ResumePoint)

    def run(self, cfg: ExperimentConfig, tags: dict[str, str]) -> tuple[dict, float]:
        """One run as a child of the parent (its MLflow tags set once it ends): its summary and
        when it started (epoch s)."""
        started = time.time()
        summary = run_experiment(cfg, fresh=True, echo=self.echo, parent_run_id=self.parent)
        if tags:
            self.tracker.set_tags(summary["mlflow_run_id"], tags)
        return summary, started

    def header(self) -> dict:
        return {
            "suite": self.suite.name,
            "experiment": self.base.name,
            "target_val_loss": self.base.stop.target_val_loss,
            "mlflow_parent_run_id": self.parent,
            "mlflow_experiment_id": self.tracker.experiment_id,
            "mlflow_view_key": f"compare-{self.parent}",
            "mlflow_tracking_uri": self.tracker.uri,
            "suite_fingerprint": self.fingerprint,
        }


def run_comparison(
    suite: SuiteConfig,
    experiment: dict,
    overrides: list[str],
    echo: Callable[[str], None] = print,
    resume: bool = False,
    tune_only: bool = False,
) -> dict:
    """Run the suite (`resume`: keep the whole units an interrupted run of it finished,
    copus.cluster.compare_resume; `tune_only`: stop once the tuning choice is written, so that
    what is predicted of the evaluation can be written down between the two phases)."""
    if tune_only and suite.tune is None:
        raise ConfigError(f"--tune-only: suite {suite.name!r} has no tune section, so no tuning phase to run")
    out = Location.parse(suite.output_dir)
    out.mkdir()
    fingerprint = suite_fingerprint(suite, experiment, overrides)
    point = resume_point(out, fingerprint) if resume else ResumePoint()
    if resume:
        echo(f"== {suite.name}: resuming from {out / 'comparison.json'}: {point.kept()}")
    base = config_from_mapping(experiment, suite.set + overrides)
    tracker = Tracker(base.resolved_tracking_uri(), base.tracking.experiment)
    parent = tracker.start_run(
        f"compare: {suite.name}",
        flatten({"suite": suite.model_dump(mode="json")}),
        {"kind": "comparison", "copus.output_dir": str(out)},
    )
    table_dir = suite_table_dir(suite, base)
    ctx = _Suite(suite, experiment, overrides, base, out, table_dir, tracker, parent, echo, fingerprint, point)
    try:
        result = run_phases(ctx, tune_only)
    except BaseException:
        tracker.finish(parent, "FAILED")
        raise
    if tune_only:
        tracker.finish(parent)
        return {**result, "output_dir": str(out)}
    _log_to_parent(tracker, parent, list(result["policies"]), suite, result)
    result["output_dir"] = str(out)
    echo(comparison_table(result))
    return result


def run_phases(ctx: _Suite, tune_only: bool = False) -> dict:
    """The tuning phase, then (unless `tune_only`) the evaluation; what comparison.json holds."""
    tuning, tuned = _tune(ctx)
    if tune_only:
        ctx.echo(f"== {ctx.suite.name}: tuning chosen and written; the evaluation runs with --resume")
        return {**ctx.header(), "policies": {}, "runs": [], "tuning": tuning}
    return _evaluate(ctx, tuning, tuned)


def _tune(ctx: _Suite) -> tuple[dict | None, dict[str, TuningCandidate]]:
    """The tuning phase: every candidate on every tuning seed (shuffled per seed like a repeat),
    then per kind the choice (`choose_tuned`), written to comparison.json with `chosen_at` before
    any evaluation run starts. Returns the `tuning` block and the chosen candidate per entry."""
    candidates = {c.name: c for c in tuning_candidates(ctx.suite, ctx.base)}
    if not candidates:
        return None, {}
    if ctx.resume.tuning is not None:  # chosen (and written down) before: kept as it was
        tuning = ctx.resume.tuning
        return tuning, {entry: candidates[name] for entry, name in tuning["chosen"].items() if name}
    rows: list[dict] = []
    orders = [_order(ctx.suite, list(candidates), k) for k in range(len(ctx.suite.tuning_seeds))]
    tuning = {"seeds": ctx.suite.tuning_seeds, "rule": CHOICE_RULE, "run_order": orders, "runs": rows}
    for k, (seed, order) in enumerate(zip(ctx.suite.tuning_seeds, orders)):
        if k in ctx.resume.tuning_rows:
            rows.extend(ctx.resume.tuning_rows[k])
            continue
        for position, name in enumerate(order):
            label = f"tuning/{name}/s{seed}"
            ctx.echo(f"== {ctx.suite.name}: tuning {name}, seed {seed} ({k + 1}/{len(orders)})")
            cfg = _run_config(ctx, list(candidates[name].overrides), label, seed, ctx.out / label)
            summary, started = ctx.run(cfg, {"copus.phase": "tuning", "copus.candidate": name})
            row = _run_row(candidates[name].kind, k, seed, summary)
            rows.append({"candidate": name, **row, "position": position, "started_at": started})
            _write(ctx, {**ctx.header(), "policies": {}, "runs": [], "tuning": tuning})
    tuning["candidates"] = [candidate_result(c, rows) for c in candidates.values()]
    tuning["chosen"] = choose_tuned(tuning["candidates"])
    tuning["chosen_at"] = time.time()
    for entry, name in tuning["chosen"].items():
        missed = f"warning: no {entry}: no candidate reached the target on every tuning seed"
        ctx.echo(f"== {ctx.suite.name}: {entry} is {name} (chosen on the tuning seeds)" if name else missed)
    _write(ctx, {**ctx.header(), "policies": {}, "runs": [], "tuning": tuning})  # pre-registered
    return tuning, {entry: candidates[name] for entry, name in tuning["chosen"].items() if name}


def _evaluate(ctx: _Suite, tuning: dict | None, tuned: dict[str, TuningCandidate]) -> dict:
    """The evaluation phase: every policy and tuned entry on every repeat's seed, in a shuffled
    order per repeat; comparison.json rewritten after every run."""
    suite = ctx.suite
    entries = suite.policies + list(suite.variants) + list(tuned)
    orders = [_order(suite, entries, r) for r in range(suite.evaluation_repeats)]
    runs: list[dict] = []
    summaries: dict[tuple[str, int], dict] = {}
    for repeat, order in enumerate(orders):
        if repeat in ctx.resume.repeats:
            runs.extend(ctx.resume.repeats[repeat])
            continue
        for position, entry in enumerate(order):
            seed = suite.run_seed(ctx.base.workload.seed, repeat, entries.index(entry))
            run_dir = ctx.out / entry / f"r{repeat}"
            if entry in tuned:
                cfg = _run_config(ctx, list(tuned[entry].overrides), f"{entry}/r{repeat}", seed, run_dir)
            elif entry in suite.variants:
                cfg = _variant_config(ctx, entry, repeat, seed, run_dir)
            else:
                cfg = _policy_config(suite, ctx.experiment, ctx.overrides, entry, repeat, seed, run_dir, ctx.table_dir)
            ctx.echo(f"== {suite.name}: {entry}, repeat {repeat + 1}/{len(orders)}, seed {seed}")
            summary, started = ctx.run(cfg, {} if entry in suite.policies else {"policy": entry})
            runs.append({**_run_row(entry, repeat, seed, summary), "position": position, "started_at": started})
            summaries[(entry, repeat)] = summary
            add_counterfactual_audits(
                runs, summaries, entries, lambda out: read_records_log(Location.parse(out)), ctx.echo
            )
            _write(ctx, _result(ctx, entries, orders, runs, tuning))
    result = _result(ctx, entries, orders, runs, tuning)
    _write(ctx, result)
    return result


def _order(suite: SuiteConfig, names: list[str], repeat: int) -> list[str]:
    return run_order(names, repeat, suite.order_seed, suite.order == "shuffled")


def _result(ctx: _Suite, entries: list[str], orders: list[list[str]], runs: list[dict], tuning: dict | None) -> dict:
    """comparison.json as it stands: per-entry statistics, the best baseline, orders, runs, tuning."""
    adaptive = adaptive_entries(ctx.suite)
    policies = summarize(runs, entries, adaptive)
    result = {
        **ctx.header(),
        "policies": policies,
        "adaptive": list(adaptive),
        "run_order": {"order": ctx.suite.order, "order_seed": ctx.suite.order_seed, "repeats": orders},
        "runs": runs,
        "best_baseline": best_baseline(policies, [p for p in entries if p not in adaptive]),
    }
    return result if tuning is None else {**result, "tuning": tuning}


def adaptive_entries(suite: SuiteConfig) -> tuple[str, ...]:
    """The suite's entries of COPUS: its policies and the variants of them; the rest are baselines."""
    return ADAPTIVE + tuple(name for name, v in suite.variants.items() if v.policy in ADAPTIVE)


def _write(ctx: _Suite, result: dict) -> None:
    write_json_atomic(ctx.out / "comparison.json", result)


def _policy_config(
    suite: SuiteConfig,
    experiment: dict,
    overrides: list[str],
    policy: str,
    repeat: int,
    seed: int,
    run_dir: Location,
    table_dir: str,
    label: str | None = None,
):
    """One run of the suite: the experiment with the suite's settings, the policy, its seed, its own
    output directory and MLflow name (`label`, default the policy's), and the suite's shared profile table. A ramp the experiment
    carries is dropped for every policy but ramp (batch.ramp is refused with any other)."""
    has_ramp = (apply_overrides(experiment, suite.set + overrides).get("batch") or {}).get("ramp") is not None
    policy_overrides = [
        f"policy.name={policy}",
        *(["policy.layout=best"] if policy == "static" and suite.static_layout == "best" else []),
        *(["batch.ramp=null"] if policy != "ramp" and has_ramp else []),
    ]
    return config_from_mapping(
        experiment,
        suite.set
        + overrides
        + policy_overrides
        + _run_overrides(suite, f"{label or policy}/r{repeat}", seed, run_dir, table_dir),
    )


def _variant_config(ctx: _Suite, name: str, repeat: int, seed: int, run_dir: Location) -> ExperimentConfig:
    """A run of a variant: its policy's run with the variant's own overrides on top, under its name."""
    variant = ctx.suite.variants[name]
    overrides = ctx.overrides + variant.set
    return _policy_config(
        ctx.suite, ctx.experiment, overrides, variant.policy, repeat, seed, run_dir, ctx.table_dir, label=name
    )


def _run_config(ctx: _Suite, run_overrides: list[str], label: str, seed: int, run_dir: Location) -> ExperimentConfig:
    """A run of a tuning candidate or a tuned entry: its own overrides on the suite's experiment."""
    return config_from_mapping(
        ctx.experiment,
        ctx.suite.set + ctx.overrides + run_overrides + _run_overrides(ctx.suite, label, seed, run_dir, ctx.table_dir),
    )


def _run_overrides(suite: SuiteConfig, label: str, seed: int, run_dir: Location, table_dir: str) -> list[str]:
    """What every run of a suite sets: its seed, output directory, MLflow name, shared profile table."""
    return [
        f"workload.seed={seed}",
        f"output_dir={run_dir}",
        f"tracking.run_name={suite.name}/{label}",
        f"profile.table_dir={table_dir}",
    ]


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
        "reversed_switches": summary.get("reversed_switches", 0),
        "wall_clock_s": summary["wall_clock_s"],
        "initial_layout": summary["initial_layout"],
        "final_layout": summary["layout"],
        "mlflow_run_id": summary["mlflow_run_id"],
        "output_dir": summary["output_dir"],
    }


def _log_to_parent(tracker: Tracker, parent: str, entries: list[str], suite: SuiteConfig, result: dict) -> None:
    """The finished suite on its MLflow parent run: per-entry figures, speedups, final configurations,
    the comparison file, a name that says the outcome, and the shared results view."""
    for policy, stats in result["policies"].items():
        values = {
            f"time_to_target_s.{policy}": stats["time_to_target_s"],
            f"final_val_loss.{policy}": stats["final_val_loss"],
        }
        tracker.log_values(parent, {k: v for k, v in values.items() if v is not None}, step=0)
    adaptive = tuple(result.get("adaptive", ADAPTIVE))
    tracker.log_values(parent, speedup_metrics(result["policies"], adaptive), step=0)
    tracker.set_tags(parent, final_configs(result["runs"]))
    tracker.log_dict(parent, result, "comparison.json")
    tracker.rename(parent, f"compare: {suite.name} | {speedup_phrase(result['policies'])}")
    tracker.finish(parent)
    tracker.share_view(result["mlflow_view_key"], comparison_columns(entries, adaptive))


def speedup_metrics(policies: dict, adaptive: tuple[str, ...] = ADAPTIVE) -> dict[str, float]:
    """The parent run's speedup metrics: copus's under the plain names, the ablation's and the
    variants' suffixed."""
    out = {}
    for policy in adaptive:
        s = policies.get(policy, {})
        suffix = "" if policy == "copus" else f".{policy}"
        for key in ("speedup_vs_fastest_baseline", "paired_speedup_mean"):
            if s.get(key) is not None:
                out[key + suffix] = s[key]
        best = s.get("vs_best_baseline") or {}
        for key in ("speedup", "samples_ratio", "speed_ratio"):  # the speedup and its two sides
            if best.get(key) is not None:
                out[f"{key}_vs_best_baseline{suffix}"] = best[key]
    ablation = policies.get("copus", {}).get("vs_copus_gbs") or {}
    if ablation.get("paired_speedup_mean") is not None:
        out["paired_speedup_vs_copus_gbs"] = ablation["paired_speedup_mean"]
    for variant in (p for p in adaptive if p not in ADAPTIVE):
        share = (policies.get(variant) or {}).get("share_of_copus_gain") or {}
        if share.get("share") is not None:
            out[f"share_of_copus_gain.{variant}"] = share["share"]
    return out


def final_configs(runs: list[dict]) -> dict[str, str]:
    """Parent-run tags: where each policy's runs ended, the most frequent final configuration."""
    out = {}
    for policy in dict.fromkeys(r["policy"] for r in runs):
        labels = [CandidateConfig.from_dict(r["final_layout"]).label() for r in runs if r["policy"] == policy]
        top = max(set(labels), key=labels.count)
        out[f"final_config.{policy}"] = f"{top} ({labels.count(top)}/{len(labels)})"
    return out


def comparison_columns(policies: list[str], adaptive: tuple[str, ...] = ADAPTIVE) -> list[str]:
    """The columns of a comparison's shared MLflow view: its parent run's figures per policy."""
    speedups = [
        f"metrics.`{key}{'' if p == 'copus' else '.' + p}`"
        for p in adaptive
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
    adaptive = tuple(result.get("adaptive", ADAPTIVE))
    for policy in adaptive:
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
    lines += log_ratio_lines(result["policies"], adaptive)
    lines += variant_lines(result["policies"], adaptive)
    lines += tuning_lines(result.get("tuning"))
    lines += counterfactual_lines(result["runs"])
    # A run's output_dir is SUITE_DIR/<policy>/r<repeat> (a path or URI; its query is left out here).
    suite_dir = result["runs"][0]["output_dir"].partition("?")[0].rsplit("/", 2)[0]
    lines.append(f"comparison: {suite_dir}/comparison.json")
    return "\n".join(lines)


def paired_lines(s: dict) -> list[str]:
    """The paired-by-repeat speedup line of a comparison entry, when it has an interval."""
    text = paired_speedup_text(s)
    if text is None:
        return []
    per = ", ".join(f"{x:+.1%}" for x in s["paired_speedup_per_repeat"])
    return [f"  paired by repeat: mean {text}; per repeat {per}"]


def variant_lines(policies: dict, adaptive: tuple[str, ...]) -> list[str]:
    """Each variant of COPUS against copus (paired log-ratio) and the share of copus's gain over
    the best baseline it reaches."""
    lines = []
    for variant in (p for p in adaptive if p not in ADAPTIVE):
        s = policies.get(variant) or {}
        block, share = s.get("vs_copus"), s.get("share_of_copus_gain")
        if block and block["log_ratio_mean"] is not None:
            lines.append(f"{variant} vs copus, paired log-ratio: {log_ratio_text(block, variant)}")
        if share and share["share"] is not None:
            lines.append(
                f"  {variant} reaches {share['share']:.0%} ({share_interval_text(share)}) of copus's gain "
                f"over {share['baseline']} ({share['n_pairs']} paired seeds)"
            )
    return lines


def log_ratio_lines(policies: dict, adaptive: tuple[str, ...] = ADAPTIVE) -> list[str]:
    """COPUS (its ablation, its variants) against the best baseline, then copus against each
    baseline: the paired log-ratio's speedup and 95% interval over the evaluation seeds."""
    lines = []
    for policy in adaptive:
        best = (policies.get(policy) or {}).get("vs_best_baseline")
        if best and best["log_ratio_mean"] is not None:
            lines.append(
                f"{policy} vs best baseline ({best['baseline']}), paired log-ratio: {log_ratio_text(best, policy)}"
            )
            lines += side_lines(best)
    for baseline, block in (policies.get("copus") or {}).get("paired_log_ratio", {}).items():
        if block["log_ratio_mean"] is not None:
            lines.append(f"  copus vs {baseline}: {log_ratio_text(block)}")
    return lines


def side_lines(block: dict) -> list[str]:
    """The speedup's two factors (copus.core.comparison.goodput_sides), when they have intervals."""
    text = sides_text(block)
    if text is None:
        return []
    return [
        f"    = {text}, 95% CIs over {block['n_sides']} pairs (statistical: the baseline's samples to target "
        "over these; throughput: samples per second over the baseline's)"
    ]


def tuning_lines(tuning: dict | None) -> list[str]:
    """The tuning phase: each candidate's geometric-mean time to target on the tuning seeds and
    which one each tuned entry runs."""
    if not tuning or "chosen" not in tuning:
        return []
    seeds = ", ".join(str(s) for s in tuning["seeds"])
    lines = [f"tuning on seeds {seeds}, chosen before the evaluation by the lowest mean log time to target:"]
    for c in tuning["candidates"]:
        time_s = "missed" if c["geomean_time_to_target_s"] is None else f"{c['geomean_time_to_target_s']:.1f} s"
        chosen = f"  -> {c['entry']}" if tuning["chosen"].get(c["entry"]) == c["name"] else ""
        lines.append(f"  {c['name']:<16} {time_s:>10}{chosen}")
    lines += [
        f"  {entry}: not run (no candidate reached the target on every seed)"
        for entry, name in tuning["chosen"].items()
        if name is None
    ]
    return lines


def counterfactual_lines(runs: list[dict]) -> list[str]:
    """One line per audited first change of GBS: predicted against realized (against static) gain."""
    lines = []
    for row in runs:
        audit = row.get("counterfactual_audit") or {}
        if audit.get("from_gbs") is None:
            continue
        head = f"{row['policy']} r{row['repeat']}: GBS {audit['from_gbs']} -> {audit['to_gbs']} at step {audit['step']}"
        if audit.get("realized_efficiency_gain") is None:
            lines.append(f"{head}: not audited against static ({audit.get('audit_note')})")
            continue
        low, high = audit["realized_efficiency_interval"]
        lines.append(
            f"{head}: statistical efficiency x{_gain(audit['predicted_efficiency_gain'])} predicted, "
            f"x{audit['realized_efficiency_gain']:.2f} realized against static [95% {low:.2f}..{high:.2f}], "
            f"x{_gain(audit.get('one_run_efficiency_gain'))} read off the run alone"
        )
    return lines


def _gain(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f}"
