"""The comparison protocol of `copus simulate` (a simulation YAML's `protocol` section): every
baseline at its best, COPUS over several seeds of the planner's estimation noise.

- tuned static: static at every GBS of the search grid, each in its fastest configuration;
  the fastest of them.
- tuned ramp: Megatron-LM's linear ramp from the smallest GBS of the grid its configuration
  admits, by dp × MBS (the finest Megatron allows), to every final GBS of the grid, over each
  of a few lengths (`ramp_lengths`: shares of the samples the target takes at a vanishingly
  small batch), in the configuration of best throughput at the final GBS; the fastest.
- the setting's own policies (the paper's baselines: static at batch.gbs, cbs-pessimistic,
  cbs-optimistic), COPUS and its ablation copus-gbs, once per evaluation seed
  (`estimate.seed`, +1, ...), each seed with its own profile of the cluster (`s.profile`).

Three kinds of baseline, and a ceiling (issue 42):

- hindsight-tuned (`tuned-static`, `tuned-ramp`): tuned on the truth they are scored on, the
  truth's own step times and no noise: a bound no user reaches;
- user-tuned (`user-static@0.5x`, `user-static@2x`, `user-ramp@...`): tuned as a user could,
  in the world the user has in advance: the profile's step-time table (the first seed's) and the
  critical batch off by ×0.5 or ×2 (`USER_GUESSES`), then scored on the truth;
- the paper's (the setting's own policies);
- the perfect planner (`perfect_setting`): COPUS with the exact critical batch and step times,
  no quantile, no transient priced, no fixed switch cost: the most a planner could gain.

The best baseline is the fastest by mean time over the seeds (a hindsight-tuned one, as a rule);
COPUS is set against it, against the best of each kind and against copus-gbs seed by seed
(`copus.core.comparison.paired_against`). Pure: no torch, no ray.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

import numpy as np

from copus.core.comparison import paired_against, summarize
from copus.core.layout import CandidateConfig, layout_problems
from copus.core.policy_names import ADAPTIVE, SCHEDULED, TUNED_ENTRY
from copus.core.ramp import BatchRamp
from copus.core.search import gbs_grid
from copus.core.sim_view import PlannerView, exact_view
from copus.core.simulator import Setting, SimResult, planner_view, simulate

Space = tuple[list[CandidateConfig], np.ndarray]
# Ramp lengths tried by default, as shares of the samples the target takes at a vanishingly
# small batch: from a short warm-up ramp to one spanning the run, about 3x apart.
RAMP_LENGTHS = (0.03, 0.1, 0.3, 1.0)
# The user's guesses of the critical batch: off by x0.5 and x2 (the spread of log c over the
# calibrations in docs/, sd 0.69, puts the truth within this range about 2 times in 3).
USER_GUESSES = (0.5, 2.0)


@dataclass
class Tuned:
    """A baseline tuned over a grid: the best run, what it chose, and every point tried."""

    best: SimResult | None
    choice: dict
    tried: list[dict]

    def as_dict(self) -> dict:
        return {
            "time_to_target_s": self.best.time_to_target_s if self.best else None,
            "choice": self.choice,
            "tried": self.tried,
        }


class _Search:
    """The fastest of a grid of runs, tried from the largest GBS down (those take the fewest
    steps). A point is skipped when even its lower bound, the samples the target takes at a
    vanishingly small batch at its best throughput, is slower than the best so far; a run stops
    once it is slower than the best (`max_hours`): it cannot win, and small GBS take millions
    of steps to simulate. Either way the point reads "slower than the best"."""

    def __init__(self, s: Setting, space: Space, view: PlannerView):
        self.s, self.space, self.view, self.best, self.choice, self.tried = s, space, view, None, {}, []

    def run(self, choice: dict, policy: str, lower_bound_s: float, **changes) -> None:
        best_s = self.best.time_to_target_s if self.best is not None else None
        if best_s is not None and lower_bound_s >= best_s:
            self.tried.append(choice | {"time_to_target_s": None, "stopped": "slower than the best"})
            return
        hours = self.s.max_hours if best_s is None else min(self.s.max_hours, best_s / 3600)
        r = simulate(replace(self.s, max_hours=hours, **changes), policy, self.space, self.view)
        pruned = r.stopped == "max_hours" and hours < self.s.max_hours
        stopped = "slower than the best" if pruned else r.stopped
        self.tried.append(
            choice | {"config": r.final.as_dict(), "time_to_target_s": r.time_to_target_s, "stopped": stopped}
        )
        if r.time_to_target_s is not None and (best_s is None or r.time_to_target_s < best_s):
            self.best, self.choice = r, choice | {"config": r.final.as_dict()}

    def tuned(self) -> Tuned:
        return Tuned(self.best, self.choice, self.tried)


def fastest_at(space: Space, gbs: int) -> tuple[CandidateConfig, float] | None:
    """The configuration of best throughput at `gbs`, and its samples/s."""
    cands, throughputs = space
    at = [i for i, c in enumerate(cands) if c.gbs == gbs]
    if not at:
        return None
    best = max(at, key=lambda i: throughputs[i])
    return cands[best], float(throughputs[best])


def min_samples(s: Setting) -> float:
    """Samples the target takes at a vanishingly small batch (the loss curve's tokens to it): no
    run needs fewer, since a step of B samples is worth at most B."""
    tokens = s.curve.tokens_to(s.shape.param_count(), s.target_loss)
    return (tokens or 0.0) / s.seq_len


def tune_static(s: Setting, space: Space, view: PlannerView | None = None) -> Tuned:
    """Static at every GBS of the grid, each in the configuration of best throughput there (as
    `view` reads it: default the truth's own, the hindsight bound)."""
    search = _Search(s, space, view or exact_view(*space))
    for gbs in reversed(gbs_grid(s.gbs_min, s.gbs_max)):
        fastest = fastest_at(space, gbs)
        if fastest is not None:
            bound = min_samples(s) / fastest[1]
            search.run({"gbs": gbs}, "static", bound, start=replace(s.start, gbs=gbs))
    return search.tuned()


def ramp_to(s: Setting, cfg: CandidateConfig, samples: int) -> BatchRamp | None:
    """Megatron's linear ramp to `cfg`'s GBS over `samples`, in its layout and MBS: from the
    smallest GBS of the grid they admit, by dp × MBS. None when they admit none below it."""
    admitted = [
        g
        for g in gbs_grid(s.gbs_min, cfg.gbs)
        if not layout_problems(cfg.dp, cfg.tp, cfg.pp, s.shape, None, g, cfg.mbs)
    ]
    if not admitted or admitted[0] >= cfg.gbs:
        return None
    return BatchRamp.linear(admitted[0], cfg.dp * cfg.mbs, max(1, samples), cfg.gbs)


def tune_ramp(
    s: Setting, space: Space, lengths: tuple[float, ...] = RAMP_LENGTHS, view: PlannerView | None = None
) -> Tuned:
    """A ramp to every final GBS of the grid, in the configuration of best throughput there
    (a fixed configuration runs fastest at its largest GBS: the bound), over each length (`view`
    as `tune_static`'s)."""
    search = _Search(s, space, view or exact_view(*space))
    for final in reversed(gbs_grid(s.gbs_min, s.gbs_max)):
        fastest = fastest_at(space, final)
        for share in lengths if fastest is not None else ():
            ramp = ramp_to(s, fastest[0], round(share * min_samples(s)))
            if ramp is not None:
                choice = {"start_gbs": ramp.start_gbs, "increment": ramp.points[1][1] - ramp.points[0][1]}
                choice |= {"final_gbs": final, "samples": ramp.end_samples, "length_share": share}
                search.run(choice, "ramp", min_samples(s) / fastest[1], ramp=ramp)
    return search.tuned()


def _row(policy: str, repeat: int, r: SimResult) -> dict:
    """A run as `copus.core.comparison.summarize` reads it."""
    return {
        "policy": policy,
        "repeat": repeat,
        "time_to_target_s": r.time_to_target_s,
        "reached_target": r.time_to_target_s is not None,
        "final_val_loss": r.final_loss,
        "samples": r.samples,
        "reconfigurations": len(r.reconfigurations),
        "reversed_switches": r.reversed_switches,
        "layout_changes": r.layout_changes,
        "replica_changes": r.replica_changes,
    }


def evaluate(
    s: Setting,
    space: Space,
    policies: list[str],
    seeds: int,
    first: dict[str, SimResult] | None = None,
    views: list[PlannerView] | None = None,
) -> list[dict]:
    """Every policy under `seeds` seeds of the estimation noise (`first`: runs already made at
    the first seed), seed k reading `views[k]` (default its own profile, `planner_view`). A
    policy that reads no estimate runs once and stands for every seed where the planner's table
    is exact; with a profile, its configuration follows each seed's."""
    first = first or {}
    views = views or seed_views(s, space, seeds)
    rows = []
    for policy in policies:
        once = policy in SCHEDULED and s.profile.exact
        for k in range(seeds):
            if k == 0 and policy in first:
                r = first[policy]
            elif once and k > 0:
                r = rows[-1]["result"]  # this policy's run at the previous seed: the same run
            else:
                r = simulate(
                    replace(s, estimate=replace(s.estimate, seed=s.estimate.seed + k)), policy, space, views[k]
                )
            rows.append(_row(policy, k, r) | {"result": r})
    return rows


def seed_views(s: Setting, space: Space, seeds: int) -> list[PlannerView]:
    """The planner's table at each evaluation seed: each seed profiles the cluster anew."""
    return [planner_view(s, space, s.estimate.seed + k) for k in range(seeds)]


def user_world(view: PlannerView) -> Space:
    """The cluster as a user knows it in advance: the profile's table, for truth."""
    cands = list(view.throughputs)
    return cands, np.array([view.throughputs[c] for c in cands])


def scored_as_user(
    s: Setting, space: Space, views: list[PlannerView], guess: float, lengths: tuple[float, ...]
) -> dict[str, tuple[Tuned, list[SimResult]]]:
    """Tuned static and ramp chosen as a user could (module docstring): in the user's world, the
    first seed's profile and the critical batch times `guess`; each choice then run on the truth
    at every seed, reading that seed's profile as the other policies do (its configuration at the
    chosen GBS, paired with theirs)."""
    believed = replace(s, critical=s.critical.scaled(guess))
    world = user_world(views[0])
    out = {}
    static = tune_static(believed, world, views[0])
    if static.best is not None:
        chosen = replace(s, start=replace(s.start, gbs=static.choice["gbs"]))
        out[f"user-static@{guess:g}x"] = (static, [simulate(chosen, "static", space, v) for v in views])
    ramp = tune_ramp(believed, world, lengths, views[0])
    if ramp.best is not None:
        c = ramp.choice
        schedule = BatchRamp.linear(c["start_gbs"], c["increment"], c["samples"], c["final_gbs"])
        out[f"user-ramp@{guess:g}x"] = (ramp, [simulate(replace(s, ramp=schedule), "ramp", space, v) for v in views])
    return out


def perfect_setting(s: Setting) -> Setting:
    """The perfect planner's setting: the exact critical batch (no noise, no lag, no mapping
    error, the configured c read instead of a calibration's) and step times, no quantile, no
    transient priced and no fixed switch cost."""
    oracle = replace(s.estimate, mapping_error=1.0, noise=0.0, half_life_share=0.0, min_half_life=0.0)
    rule = replace(s.rule, rule="quantile", quantile_z=0.0, transient_steps=0.0, gain_floor=0.0)
    costs = replace(s.costs, in_place_fixed_s=0.0)
    exact = {"profile": replace(s.profile, exact=True), "calibration": replace(s.calibration, use=False)}
    return replace(s, estimate=oracle, rule=rule, costs=costs, **exact)


def _spread(values: list[float]) -> dict:
    mean = statistics.fmean(values) if values else None
    sd = statistics.stdev(values) if len(values) > 1 else (0.0 if values else None)
    return {"mean": mean, "sd": sd, "per_seed": values}


def summary(runs: list[dict], baselines: list[str]) -> dict:
    """COPUS against the best baseline and against copus-gbs, its layout changes, and the share
    of its gain over the best baseline that co-adapting the layout brings: (copus-gbs − copus) /
    (best − copus) in mean times, None unless COPUS is ahead; above 1 when copus-gbs alone is
    behind the best baseline."""
    stats = summarize(runs, [*baselines, *ADAPTIVE])
    mean = {p: stats[p]["time_to_target_s"] for p in stats}
    done = [p for p in baselines if mean[p] is not None]  # reached the target on every seed
    best = min(done, key=mean.get) if done else None
    vs_best = paired_against(runs, best)["paired_speedup_per_repeat"] if best else []
    gbs_only = paired_against(runs, best, "copus-gbs")["paired_speedup_per_repeat"] if best else []
    vs_gbs = paired_against(runs, "copus-gbs")["paired_speedup_per_repeat"]
    # A baseline that missed the target in some seed is behind a COPUS that reached it in all: None.
    ahead = {p: mean[p] / mean["copus"] - 1 if mean[p] else None for p in baselines} if mean["copus"] else {}
    gain = (mean[best] - mean["copus"]) if best and mean["copus"] else None
    layout_share = (mean["copus-gbs"] - mean["copus"]) / gain if gain and gain > 0 and mean["copus-gbs"] else None
    changes = lambda key: _spread([float(r[key]) for r in runs if r["policy"] == "copus"])  # noqa: E731
    return {
        "policies": stats,
        "best_baseline": best,
        "copus_vs_best_baseline": _spread(vs_best),
        "copus_vs_copus_gbs": _spread(vs_gbs),
        "copus_gbs_vs_best_baseline": _spread(gbs_only),
        "copus_vs_each_baseline": ahead,
        "copus_ahead_of_every_baseline": bool(ahead) and all(v is None or v > 0 for v in ahead.values()),
        "copus_layout_changes": changes("layout_changes"),  # of dp x tp x pp
        "copus_replica_changes": changes("replica_changes"),  # of the layout, sharding or recomputation
        "layout_share_of_gain": layout_share,
    }


def against_kinds(runs: list[dict], kinds: dict[str, list[str]]) -> dict:
    """COPUS against the fastest baseline (by mean time) of each kind, seed by seed."""
    stats = summarize(runs, [p for names in kinds.values() for p in names])
    out = {}
    for kind, names in kinds.items():
        done = [p for p in names if stats[p]["time_to_target_s"] is not None]
        best = min(done, key=lambda p: stats[p]["time_to_target_s"]) if done else None
        vs = paired_against(runs, best)["paired_speedup_per_repeat"] if best else []
        out[kind] = {"baseline": best, "copus_vs": _spread(vs)}
    return out


def ceiling(perfect: SimResult, runs: list[dict], best: str | None) -> dict:
    """The perfect planner's time, its gain over the best baseline, and the share of that gain
    COPUS takes ((t_best − t_copus) / (t_best − t_perfect) in mean times; None without a gain)."""
    mean = lambda p: statistics.fmean(r["time_to_target_s"] for r in runs if r["policy"] == p)  # noqa: E731
    t = perfect.time_to_target_s
    reached = (
        best is not None
        and t is not None
        and all(r["time_to_target_s"] for r in runs if r["policy"] in (best, "copus"))
    )
    gain = mean(best) - t if reached else None
    return {
        "time_to_target_s": t,
        "vs_best_baseline": mean(best) / t - 1 if reached else None,
        "copus_share_of_gain": (mean(best) - mean("copus")) / gain if gain and gain > 0 else None,
        "reconfigurations": len(perfect.reconfigurations),
    }


def _user_entry(tuned: Tuned, scored: list[SimResult]) -> dict:
    """A user-tuned baseline as the JSON reports it: its tuning, and its run on the truth at
    every seed (configuration and time)."""
    runs = [{"config": r.final.as_dict(), "time_to_target_s": r.time_to_target_s} for r in scored]
    return tuned.as_dict() | {"scored": runs}


def run_protocol(
    s: Setting,
    space: Space,
    policies: list[str],
    seeds: int,
    lengths: tuple[float, ...] = RAMP_LENGTHS,
    first: dict[str, SimResult] | None = None,
) -> dict:
    """The whole protocol of one setting: hindsight-tuned static and ramp, the user-tuned ones,
    every policy over the seeds, and the perfect planner's ceiling."""
    tuned = {TUNED_ENTRY["static"]: tune_static(s, space), TUNED_ENTRY["ramp"]: tune_ramp(s, space, lengths)}
    views = seed_views(s, space, seeds)
    user: dict[str, tuple[Tuned, list[SimResult]]] = {}
    for guess in USER_GUESSES:
        user |= scored_as_user(s, space, views, guess, lengths)
    evaluated = list(dict.fromkeys([*policies, *ADAPTIVE]))
    runs = evaluate(s, space, evaluated, seeds, first, views)
    for name, t in tuned.items():
        if t.best is not None:
            runs += [_row(name, k, t.best) for k in range(seeds)]
    runs += [_row(name, k, r) for name, (_, scored) in user.items() for k, r in enumerate(scored)]
    paper = [p for p in evaluated if p not in ADAPTIVE]
    hindsight = [n for n, t in tuned.items() if t.best is not None]
    kinds = {"paper": paper, "user_tuned": list(user), "hindsight_tuned": hindsight}
    plain = [{k: v for k, v in r.items() if k != "result"} for r in runs]
    out = summary(plain, paper + hindsight + list(user))  # a tie goes to the hindsight bound
    perfect = simulate(perfect_setting(s), "copus", space)
    return (
        {"seeds": [s.estimate.seed + k for k in range(seeds)], "ramp_lengths": list(lengths)}
        | out
        | {name: t.as_dict() for name, t in tuned.items()}
        | {"user_guesses": list(USER_GUESSES), "user_tuned": {n: _user_entry(t, r) for n, (t, r) in user.items()}}
        | {"copus_vs_kind": against_kinds(plain, kinds), "ceiling": ceiling(perfect, plain, out["best_baseline"])}
        | {"planner_view": [v.report for v in views]}
        | {"planner_calibration": [v.calibration_report for v in views]}
    )
