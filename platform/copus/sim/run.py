"""`copus simulate`: every policy of a simulation YAML on the modelled cluster, time to target
per policy, COPUS's speedup over the fastest baseline beside the paper's, and the
throughput-optimal layout for each GBS. The output names where the training truth comes
from and how far the planner's noise-scale estimate is off it (`estimate`). With a `protocol`
section, also the tuned baselines and every policy over several seeds of the estimation noise
(`copus.core.sim_protocol`), summed up in `protocol`: COPUS's layout changes, its time against
the best baseline and against copus-gbs."""

from __future__ import annotations

from copus.core.comparison import summarize
from copus.core.layout import CandidateConfig
from copus.core.sim_protocol import run_protocol
from copus.core.simulator import best_layout_by_gbs, planner_view, search_space, simulate
from copus.sim.config import SimConfig, setting_from


def run_simulation(cfg: SimConfig) -> dict:
    setting = setting_from(cfg)
    space = search_space(setting)
    view = planner_view(setting, space)  # the profile the first seed's runs read
    results = {p: simulate(setting, p, space, view) for p in cfg.policies}
    runs = [
        {
            "policy": p,
            "repeat": 0,
            "time_to_target_s": r.time_to_target_s,
            "reached_target": r.time_to_target_s is not None,
            "final_val_loss": r.final_loss,
            "samples": r.samples,
            "reconfigurations": len(r.reconfigurations),
        }
        for p, r in results.items()
    ]
    stats = summarize(runs, list(cfg.policies))
    copus = stats.get("copus", {})
    c = setting.cluster
    return {
        "name": cfg.name,
        "model": cfg.model,
        "cluster": f"{c.nodes}x{c.node.accelerators_per_node} {c.node.accelerator.name}",
        "target_loss": cfg.training.target_loss,
        "candidates": len(space[0]),
        "reconfiguration_costs_s": {
            "in_place": setting.costs.in_place_s(c, setting.shape),
            "restart": setting.costs.restart_s(c, setting.shape),
            "mode": cfg.reconfigure,
        },
        "policies": {p: r.as_dict() for p, r in results.items()},
        "copus_speedup_vs_fastest_baseline": copus.get("speedup_vs_fastest_baseline"),
        "fastest_baseline": copus.get("fastest_baseline"),
        "paper": cfg.paper.model_dump(),
        "truth": {
            # plain (the datasheet model), megatron (copus.core.megatron) or a measured profile
            "step_time": "profile" if cfg.cluster.profile is not None else cfg.cluster.framework,
            "megatron": cfg.cluster.megatron.model_dump() if cfg.cluster.framework == "megatron" else None,
            "critical_batch": setting.critical.source,
            "calibration": cfg.training.calibration,
            "efficiency": "McCandlish et al. 2018: a step of B samples is worth B*B_crit/(B_crit+B)",
        },
        "planner": {
            "efficiency": cfg.policy.efficiency,
            "critical_factor": cfg.policy.critical_factor,
            "step_times": view.report,  # the profile it read (or the truth's table), against the truth
            # the simulated calibration it read, against the truth (None: the configured c)
            "calibration": view.calibration_report,
        },
        "estimate": cfg.estimate.model_dump(),
        "overheads": cfg.overheads.model_dump(),
        "mapping_error": cfg.estimate.mapping_error,
        "best_layout_by_gbs": best_layout_by_gbs(setting),
        "protocol": _protocol(cfg, setting, space, results),
    }


def _protocol(cfg: SimConfig, setting, space, results: dict) -> dict | None:
    p = cfg.protocol
    if p is None:
        return None
    return run_protocol(setting, space, list(cfg.policies), p.seeds, tuple(p.ramp_lengths), first=results)


def _hours(seconds: float | None, stopped: str | None = None) -> str:
    if seconds is not None:
        return f"{seconds / 3600:8.2f} h"
    return f"not reached ({stopped})" if stopped else "not reached"


def _pct(x: float | None) -> str:
    return f"{x:+.1%}" if x is not None else "n/a"


def _truth_line(result: dict) -> str:
    e, p = result["estimate"], result["planner"]
    noise = f", noise {e['noise']:g} ({e['distribution']}, seed {e['seed']})" if e["noise"] > 0 else ""
    return (
        f"truth: critical batch from {result['truth']['critical_batch']}; planner: {p['efficiency']} form, "
        f"c = {p['critical_factor']:g}, sees the noise scale with mapping error x{e['mapping_error']:g}{noise}; "
        f"{_view_text(p['step_times'])}; {_calibration_text(p['calibration'])}"
    )


def _calibration_text(report: dict | None) -> str:
    """Where the planner's mapping comes from, and how far its c is from the truth's."""
    if report is None:
        return "efficiency: the configured c (calibration.use false)"
    if not report["branches"]:
        return "efficiency: the configured c (the simulated calibration measured no branch point)"
    cs = ", ".join(f"{_figure(b['c'])} (true {_figure(b['c_true'])})" for b in report["branches"])
    return (
        f"efficiency: a simulated calibration, {len(report['branches'])} branch points x {len(report['grid'])} GBS "
        f"x {report['seeds']} seeds in {_figure(report['cost_h'], '.0f')} h of the cluster; c = {cs}"
    )


def _figure(x: float | None, form: str = ".2f") -> str:
    return format(x, form) if x is not None else "n/a"


def _view_text(report: dict) -> str:
    """Where the planner's step times come from, and how far they are from the truth."""
    if report.get("exact"):
        return "step times: the truth's own (profile.exact)"
    if report.get("source") == "table":
        return (
            f"step times: the profile file {report['table']} ({report['points']} points), "
            f"{report['candidates']} candidates, off the truth by {report['table_vs_truth_mape']:.1%} mean, "
            f"{report['table_vs_truth_max_ape']:.1%} worst (median ratio x{report['table_vs_truth_median_ratio']:.2f})"
        )
    return (
        f"step times: a profile of {report['points']} points in {report['spent_s'] / 3600:.1f} h of the cluster, "
        f"{report['candidates']} candidates ({report['left_out_extrapolating']} left out: never measured), "
        f"off the truth by {report['table_vs_truth_mape']:.1%} mean, {report['table_vs_truth_max_ape']:.1%} worst"
    )


def _spread_text(spread: dict) -> str:
    """A speedup over seeds: mean, sd and each seed's."""
    if spread["mean"] is None:
        return "n/a"
    each = ", ".join(f"{x:+.1%}" for x in spread["per_seed"])
    return f"{spread['mean']:+.1%} (sd {spread['sd']:.1%}; per seed {each})"


def _count_text(spread: dict) -> str:
    """A count over seeds: mean and each seed's."""
    if spread["mean"] is None:
        return "n/a"
    return f"{spread['mean']:g} (per seed {', '.join(f'{x:g}' for x in spread['per_seed'])})"


def _tuned_lines(protocol: dict) -> list[str]:
    static, ramp = protocol["tuned-static"], protocol["tuned-ramp"]
    lines = []
    if static["time_to_target_s"] is not None:
        config = CandidateConfig.from_dict(static["choice"]["config"]).label()
        lines.append(f"  tuned static: {_hours(static['time_to_target_s'])} at {config} (every GBS of the grid tried)")
    if ramp["time_to_target_s"] is not None:
        c = ramp["choice"]
        lines.append(
            f"  tuned ramp:   {_hours(ramp['time_to_target_s'])}, GBS {c['start_gbs']} to {c['final_gbs']} by "
            f"{c['increment']} over {c['samples']:,} samples in {CandidateConfig.from_dict(c['config']).shape_label()}"
        )
    return lines


def protocol_text(protocol: dict) -> list[str]:
    """The protocol's summary lines: every policy's mean time, COPUS's layout changes, its time
    against the best baseline and copus-gbs, and the layout's share of the gain."""
    seeds = protocol["seeds"]
    lines = [
        "",
        f"protocol: {len(seeds)} seeds of the estimation noise and the profile ({seeds[0]}..{seeds[-1]}); "
        "tuned-static and tuned-ramp are tuned in hindsight on the truth (a bound), user-static and user-ramp on the "
        f"profile with the critical batch off by x{' and x'.join(f'{g:g}' for g in protocol['user_guesses'])}",
        *_tuned_lines(protocol),
    ]
    vs = protocol["copus_vs_each_baseline"]
    for policy, stats in protocol["policies"].items():
        sd = stats["time_to_target_std_s"]
        spread = f" (sd {sd / 3600:.2f} h)" if sd else ""
        against = f"   copus {_pct(vs[policy])}" if vs.get(policy) is not None else ""
        lines.append(f"  {policy:<16} {_hours(stats['time_to_target_s'], None)}{spread:<14}{against}".rstrip())
    share = protocol["layout_share_of_gain"]
    lines += [
        f"copus layout changes per run (dp x tp x pp): {_count_text(protocol['copus_layout_changes'])}; "
        f"with sharding or recomputation: {_count_text(protocol['copus_replica_changes'])}",
        f"copus vs best baseline ({protocol['best_baseline']}): {_spread_text(protocol['copus_vs_best_baseline'])}",
        f"copus vs copus-gbs (the layout's gain): {_spread_text(protocol['copus_vs_copus_gbs'])}",
        f"copus-gbs vs best baseline: {_spread_text(protocol['copus_gbs_vs_best_baseline'])}; share of copus's "
        f"gain over the best baseline from the layout: {f'{share:.0%}' if share is not None else 'n/a (no gain)'}",
        f"copus ahead of every baseline: {'yes' if protocol['copus_ahead_of_every_baseline'] else 'no'}",
        *_kind_lines(protocol),
    ]
    return lines


def _kind_lines(protocol: dict) -> list[str]:
    """COPUS against the best of each kind of baseline, and the perfect planner's ceiling."""
    lines = []
    for kind, entry in protocol["copus_vs_kind"].items():
        name = kind.replace("_", "-")
        lines.append(f"copus vs best {name} baseline ({entry['baseline']}): {_spread_text(entry['copus_vs'])}")
    c = protocol["ceiling"]
    share = c["copus_share_of_gain"]
    lines.append(
        f"ceiling (perfect planner): {_hours(c['time_to_target_s'])}, {_pct(c['vs_best_baseline'])} against the best "
        f"baseline; copus takes {f'{share:.0%}' if share is not None else 'n/a'} of that gain"
    )
    return lines


def simulation_text(result: dict) -> str:
    lines = [
        f"{result['name']}: {result['model']} on {result['cluster']}, target loss {result['target_loss']}, "
        f"{result['candidates']} feasible configurations",
        f"reconfiguration cost: in place {result['reconfiguration_costs_s']['in_place']:.0f} s, restart "
        f"{result['reconfiguration_costs_s']['restart']:.0f} s (runs use {result['reconfiguration_costs_s']['mode']})",
        _truth_line(result),
        "",
        f"{'policy':<16} {'time to target':>14} {'reconf.':>7}  {'start':<46} {'final'}",
    ]
    for policy, r in result["policies"].items():
        lines.append(
            f"{policy:<16} {_hours(r['time_to_target_s'], r.get('stopped')):>14} {r['reconfigurations']:>7}  "
            f"{CandidateConfig.from_dict(r['start']).label():<46} {CandidateConfig.from_dict(r['final']).label()}"
        )
    paper = result["paper"].get("copus_speedup_vs_fastest_baseline")
    lines += [
        "",
        f"copus speedup vs fastest baseline ({result['fastest_baseline']}): "
        f"{_pct(result['copus_speedup_vs_fastest_baseline'])} (paper: {_pct(paper)})",
        "",
        "throughput-optimal configuration by GBS:",
    ]
    previous = None
    for row in result["best_layout_by_gbs"]:
        layout = CandidateConfig.from_dict(row["config"]).shape_label()
        mark = "" if previous in (None, layout) else "   <- the best layout changes"
        lines.append(f"  gbs {row['gbs']:>5}: {layout:<40} {row['samples_per_s']:8.1f} samples/s{mark}")
        previous = layout
    if result.get("protocol"):
        lines += protocol_text(result["protocol"])
    return "\n".join(lines)
