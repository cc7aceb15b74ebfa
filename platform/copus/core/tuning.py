"""The tuned baselines of a comparison suite: what a user would do instead of COPUS, tuned as a
user would tune it, under a protocol fixed before the evaluation. Pure: no torch, no ray.

A suite's `tune` section names candidates: static at each GBS of a grid (each in the profile's
fastest layout and MBS for that GBS, `policy.layout: best`, with the experiment's LR rule) and a
batch-size ramp at each of a few ramp lengths. Each candidate runs on every tuning seed; per kind
the candidate with the lowest mean log time to target wins (`choose_tuned`), and a candidate that
missed the target on any tuning seed is out. The winners run on the evaluation seeds as the
suite entries `tuned-static` and `tuned-ramp`, baselines like static and CBS. The tuning seeds
are disjoint from the evaluation seeds, and the choice is written down before the first
evaluation run starts, so no evaluation result can steer it.
"""

from __future__ import annotations

from dataclasses import dataclass

from copus.core.comparison import mean_log_time
from copus.core.layout import CandidateConfig
from copus.core.policy_names import TUNED_ENTRY

# The suite entry each kind of candidate becomes once chosen.
CHOICE_RULE = (
    "per kind, the candidate with the lowest mean log time to target over the tuning seeds; "
    "a candidate that missed the target on any tuning seed is out (ties: the first listed)"
)


@dataclass(frozen=True)
class TuningCandidate:
    """One setting a user might have tuned: `kind` (static or ramp: the policy it runs as), the
    `settings` it fixes, and the `overrides` (`--set` items) that make a suite run of it."""

    name: str
    kind: str
    settings: dict
    overrides: tuple[str, ...]

    @property
    def entry(self) -> str:
        return TUNED_ENTRY[self.kind]


def start_for_gbs(gbs: int, given: CandidateConfig, space: list[CandidateConfig]) -> CandidateConfig | None:
    """A configuration at `gbs` for the run to validate with before the profile picks the fastest:
    the experiment's own layout and MBS when they fit that GBS, else the first that does
    (`space`: the search space's configurations at `gbs`), or None when none fits."""
    fitting = [c for c in space if c.gbs == gbs]
    same = [c for c in fitting if (c.dp, c.tp, c.pp, c.mbs) == (given.dp, given.tp, given.pp, given.mbs)]
    return (same or fitting or [None])[0]


def static_candidate(gbs: int, start: CandidateConfig) -> TuningCandidate:
    """Static at `gbs` in the profile's fastest layout and MBS for it; `start` (`start_for_gbs`)
    only makes the run valid before the profile is read. A ramp of the experiment is dropped."""
    overrides = (
        "policy.name=static",
        "policy.layout=best",
        "batch.ramp=null",
        f"batch.gbs={gbs}",
        f"batch.mbs={start.mbs}",
        *layout_overrides((start.dp, start.tp, start.pp)),
    )
    return TuningCandidate(f"static-gbs{gbs}", "static", {"gbs": gbs}, overrides)


def ramp_candidate(
    start_gbs: int, increment: int, samples: int, final_gbs: int, mbs: int, layout: tuple[int, int, int]
) -> TuningCandidate:
    """Megatron's `--rampup-batch-size start_gbs increment samples` up to `final_gbs`, in one
    layout and MBS (a ramp changes only the micro-batches per step)."""
    settings = {
        "start_gbs": start_gbs,
        "increment": increment,
        "samples": samples,
        "gbs": final_gbs,
        "mbs": mbs,
        "layout": list(layout),
    }
    overrides = (
        "policy.name=ramp",
        "policy.layout=given",
        f"batch.gbs={final_gbs}",
        f"batch.mbs={mbs}",
        *layout_overrides(layout),
        f"batch.ramp={{start_gbs: {start_gbs}, increment: {increment}, samples: {samples}}}",
    )
    return TuningCandidate(f"ramp-{samples}", "ramp", settings, overrides)


def layout_overrides(layout: tuple[int, int, int]) -> list[str]:
    """The --set overrides that put an experiment in `layout` (dp, tp, pp)."""
    return [f"parallel.{axis}={size}" for axis, size in zip(("dp", "tp", "pp"), layout)]


def candidate_result(candidate: TuningCandidate, rows: list[dict]) -> dict:
    """A candidate's tuning runs (rows with seed, reached_target, time_to_target_s, samples) as
    comparison.json's `tuning.candidates` entry: per seed, and the mean log time to target when
    the target was reached on every seed (else None: the candidate is out)."""
    mine = sorted((r for r in rows if r["candidate"] == candidate.name), key=lambda r: r["seed"])
    return {
        "name": candidate.name,
        "kind": candidate.kind,
        "entry": candidate.entry,
        "settings": candidate.settings,
        "per_seed": [{k: r[k] for k in ("seed", "reached_target", "time_to_target_s", "samples")} for r in mine],
        "reached_target": bool(mine) and all(r["reached_target"] for r in mine),
        **mean_log_time(mine),
    }


def choose_tuned(results: list[dict]) -> dict[str, str | None]:
    """Per tuned entry (`tuned-static`, `tuned-ramp`), the name of the chosen candidate
    (`CHOICE_RULE`), or None when no candidate of its kind reached the target on every seed."""
    chosen: dict[str, str | None] = {}
    for entry in dict.fromkeys(r["entry"] for r in results):
        eligible = [r for r in results if r["entry"] == entry and r["mean_log_time_to_target"] is not None]
        chosen[entry] = min(eligible, key=lambda r: r["mean_log_time_to_target"])["name"] if eligible else None
    return chosen
