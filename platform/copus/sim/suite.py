"""`copus simulate SIM.yaml --suite SUITE.yaml`: the runs a comparison suite (`copus compare`)
will make, predicted on the simulated setting of its cluster before they are made (issue 42,
item 1): each policy over as many seeds of the estimation noise as the suite has evaluation
seeds, each tuning candidate over as many as it has tuning seeds (static at each GBS of
`tune.static_gbs` in its fastest layout, each ramp of `tune.ramp` in the suite's layout and MBS),
the candidates the prediction would pick and those over the evaluation seeds, the ranking, and
where COPUS changes the layout. Only what the suite names is read from it: the
truth and the planner are the simulation YAML's."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from copus.config import ConfigError, SuiteConfig
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


def _measured_entry(runs: list[dict]) -> dict:
    times = [r["time_to_target_s"] for r in runs if r.get("reached_target") and r.get("time_to_target_s")]
    return {
        "time_to_target_s": _geomean(times) if len(times) == len(runs) else None,
        "runs": len(runs),
        "reached": len(times),
        "samples": float(np.mean([r["samples"] for r in runs])),
        "reconfigurations": [r.get("reconfigurations", 0) for r in runs],
    }


def _split(predicted: dict, measured: dict, startup_s: float) -> dict:
    """Where a predicted time misses the measured one, as log ratios (measured over predicted)
    that add up to the whole: the samples to the target (the statistical side) and the samples
    per second of training time, start-up left out (the throughput side, evaluations and gaps in
    it)."""
    tp, tm = predicted["time_to_target_s"], measured["time_to_target_s"]
    if tp is None or tm is None or tp <= startup_s or tm <= startup_s:
        return {"time": None, "samples": None, "throughput": None, "startup": None}
    time = math.log(tm / tp)
    samples = math.log(measured["samples"] / predicted["samples"])
    speed = math.log((predicted["samples"] / (tp - startup_s)) / (measured["samples"] / (tm - startup_s)))
    return {"time": time, "samples": samples, "throughput": speed, "startup": time - samples - speed}


def check_prediction(prediction: dict, comparison: dict) -> dict:
    """The prediction (`predict_suite`) set against the suite as measured (its comparison.json):
    per entry the geometric-mean times, their ratio (measured / predicted) and its split into the
    statistical and throughput sides, whether it is within 15%, and the two rankings."""
    entries = prediction["policies"] | prediction["tuned"]
    by_entry: dict[str, list[dict]] = {}
    for run in comparison.get("runs", []):
        by_entry.setdefault(run["policy"], []).append(run)
    startup = float(prediction.get("overheads", {}).get("startup_s", 0.0))
    rows = {}
    for name, predicted in entries.items():
        if name not in by_entry:
            continue
        measured = _measured_entry(by_entry[name])
        split = _split(predicted, measured, startup)
        ratio = math.exp(split["time"]) if split["time"] is not None else None
        rows[name] = {
            "predicted_s": predicted["time_to_target_s"],
            "measured_s": measured["time_to_target_s"],
            "ratio": ratio,
            "within_15pct": ratio is not None and abs(ratio - 1.0) <= 0.15,
            "log_miss": split,
            "predicted_samples": predicted["samples"],
            "measured_samples": measured["samples"],
            "predicted_layout_changes": predicted["layout_changes"],
            "measured_reconfigurations": measured["reconfigurations"],
        }
    order = lambda key: sorted((k for k in rows if rows[k][key] is not None), key=lambda k: rows[k][key])  # noqa: E731
    return {
        "entries": rows,
        "predicted_ranking": order("predicted_s"),
        "measured_ranking": order("measured_s"),
        "same_ranking": order("predicted_s") == order("measured_s"),
        "all_within_15pct": bool(rows) and all(r["within_15pct"] for r in rows.values()),
    }


def check_text(c: dict) -> str:
    lines = ["prediction against the measured suite (geometric-mean time to target, s):"]
    for name, r in c["entries"].items():
        m = r["log_miss"]
        ratio = f"x{r['ratio']:.2f}" if r["ratio"] is not None else "n/a"
        split = (
            f" (samples {m['samples']:+.2f}, throughput {m['throughput']:+.2f} in log)" if m["time"] is not None else ""
        )
        predicted = f"{r['predicted_s']:.1f}" if r["predicted_s"] is not None else "miss"
        measured = f"{r['measured_s']:.1f}" if r["measured_s"] is not None else "miss"
        lines.append(f"  {name:18s} predicted {predicted:>6s}, measured {measured:>6s}: {ratio}{split}")
    lines.append("predicted ranking: " + " < ".join(c["predicted_ranking"]))
    lines.append("measured ranking:  " + " < ".join(c["measured_ranking"]))
    lines.append(f"same ranking: {c['same_ranking']}; every entry within 15%: {c['all_within_15pct']}")
    return "\n".join(lines)


def read_comparison(path: str, suite_name: str) -> dict:
    """A suite's comparison.json, refused in one line when it is unreadable, has no runs or is
    another suite's."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ConfigError(f"--measured: {path}: not a readable JSON file ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise ConfigError(f"--measured: {path}: runs: expected a comparison.json's list of runs")
    if data.get("suite") != suite_name:
        raise ConfigError(f"--measured: {path}: is suite {data.get('suite')!r}'s, not {suite_name!r}'s")
    return data
