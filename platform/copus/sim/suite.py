"""`copus simulate SIM.yaml --suite SUITE.yaml`: the runs a comparison suite (`copus compare`)
will make, predicted on the simulated setting of its cluster before they are made (issue 42,
item 1): each policy over as many seeds of the estimation noise as the suite has evaluation
seeds, each tuning candidate over as many as it has tuning seeds (static at each GBS of
`tune.static_gbs` in its fastest layout, each ramp of `tune.ramp` in the suite's layout and MBS),
the candidates the prediction would pick and those over the evaluation seeds, the ranking, and
where COPUS changes the layout. Only what the suite names is read from it: the
truth and the planner are the simulation YAML's."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from copus.config import SuiteConfig
from copus.core.layout import CandidateConfig
from copus.core.ramp import BatchRamp
from copus.core.simulator import Setting, SimResult, search_space, simulate
from copus.sim.config import SimConfig, setting_from


def _geomean(values: list[float]) -> float | None:
    return float(math.exp(np.mean(np.log(values)))) if values and all(v > 0 for v in values) else None


def _entry(results: list[SimResult]) -> dict:
    times = [r.time_to_target_s for r in results]
    reached = [t for t in times if t is not None]
    return {
        "time_to_target_s": _geomean(reached) if len(reached) == len(times) else None,
        "min_s": min(reached) if reached else None,
        "max_s": max(reached) if reached else None,
        "runs": len(results),
        "reached": len(reached),
        "samples": float(np.mean([r.samples for r in results])),
        "layout_changes": [r.layout_changes for r in results],
        "reconfigurations": [len(r.reconfigurations) for r in results],
        "changes": [[_change(c) for c in r.reconfigurations] for r in results],
    }


def _change(c: dict) -> dict:
    label = lambda d: CandidateConfig.from_dict(d).label()  # noqa: E731 - a small key
    return {"t_s": round(c["t"], 1), "samples": c["samples"], "from": label(c["from"]), "to": label(c["to"])}


# Seeds of the simulated tuning runs start here past the estimate's seed, apart from the evaluation's.
TUNING_SEED_OFFSET = 1000


def _seeded(setting: Setting, seed: int) -> Setting:
    return replace(setting, estimate=replace(setting.estimate, seed=seed))


def _runs(setting: Setting, policy: str, space, seeds: list[int], ramp_at=None) -> dict:
    return _entry([simulate(_seeded(setting, k), policy, space, ramp_at=ramp_at) for k in seeds])


def _candidates(suite: SuiteConfig, setting: Setting, experiment_gbs: int) -> dict:
    """Each tuning candidate as (the setting it runs in, its policy, the ramp's configuration):
    static at each GBS of `tune.static_gbs` (its layout the planner's fastest for it, as the
    suite's `static_layout: best`), each ramp of `tune.ramp` in its layout and MBS."""
    out = {}
    for gbs in suite.tune.static_gbs if suite.tune else []:
        out[f"static-gbs{gbs}"] = (replace(setting, start=replace(setting.start, gbs=gbs)), "static", None)
    r = suite.tune.ramp if suite.tune else None
    if r is not None:
        dp, tp, pp = r.layout or (setting.start.dp, setting.start.tp, setting.start.pp)
        at = CandidateConfig(dp, tp, pp, r.mbs or setting.start.mbs, r.start_gbs)
        for samples in r.samples:
            ramp = BatchRamp.linear(r.start_gbs, r.increment, samples, r.gbs or experiment_gbs)
            out[f"ramp-{samples}"] = (replace(setting, ramp=ramp), "ramp", at)
    return out


def _fastest(entries: dict, prefix: str) -> str | None:
    """The suite's tuning rule on predicted runs: the lowest geometric-mean time of the
    candidates that reached the target on every seed."""
    timed = {k: v["time_to_target_s"] for k, v in entries.items() if k.startswith(prefix)}
    timed = {k: t for k, t in timed.items() if t is not None}
    return min(timed, key=timed.get) if timed else None


def predict_suite(cfg: SimConfig, suite: SuiteConfig, experiment_gbs: int) -> dict:
    """The prediction of `suite`'s runs on `cfg`'s setting (times in seconds of a real run's
    wall-clock where `cfg.overheads` prices its start-up and evaluations): each policy over as
    many seeds as the suite has evaluation seeds, each tuning candidate over as many as it has
    tuning seeds (other seeds), the picks over the evaluation seeds."""
    setting = setting_from(cfg)
    space = search_space(setting)
    base = cfg.estimate.seed
    evaluation = [base + i for i in range(len(suite.evaluation_seeds) or suite.repeats)]
    tuning = [base + TUNING_SEED_OFFSET + i for i in range(len(suite.tuning_seeds) or 1)]
    policies = {policy: _runs(setting, policy, space, evaluation) for policy in suite.policies}
    candidates = _candidates(suite, setting, experiment_gbs)
    tried = {name: _runs(at, policy, space, tuning, ramp_at) for name, (at, policy, ramp_at) in candidates.items()}
    picks = {"tuned-static": _fastest(tried, "static-"), "tuned-ramp": _fastest(tried, "ramp-")}
    ranked = dict(policies)
    for kind, pick in picks.items():
        if pick is not None:
            at, policy, ramp_at = candidates[pick]
            ranked[kind] = _runs(at, policy, space, evaluation, ramp_at) | {"candidate": pick}
    order = sorted(ranked, key=lambda k: ranked[k]["time_to_target_s"] or math.inf)
    return {
        "name": cfg.name,
        "suite": suite.name,
        "target_loss": cfg.training.target_loss,
        "policies": policies,
        "tuned": {kind: ranked[kind] for kind in picks if kind in ranked},
        "tuning_candidates": tried,
        "predicted_picks": picks,
        "ranking": order,
        "overheads": cfg.overheads.model_dump(),
    }


def suite_text(p: dict) -> str:
    lines = [f"{p['name']}: the runs of suite {p['suite']} predicted (target {p['target_loss']:g})"]
    rows = list(p["policies"].items()) + list(p["tuned"].items()) + list(p["tuning_candidates"].items())
    for name, e in rows:
        t = e["time_to_target_s"]
        when = f"{t:7.1f} s" if t is not None else "   miss  "
        spread = f" ({e['min_s']:.1f}-{e['max_s']:.1f})" if e["runs"] > 1 and e["min_s"] is not None else ""
        lines.append(f"  {name:18s} {when}{spread}, {e['samples']:.0f} samples, layout changes {e['layout_changes']}")
    lines.append(f"picks: {p['predicted_picks']}")
    lines.append("ranking: " + " < ".join(p["ranking"]))
    for i, changes in enumerate(p["policies"].get("copus", {}).get("changes", [])):
        moves = "; ".join(f"{c['samples']} samples: {c['from']} -> {c['to']}" for c in changes)
        lines.append(f"  copus seed {i}: {moves or 'no change'}")
    return "\n".join(lines)
