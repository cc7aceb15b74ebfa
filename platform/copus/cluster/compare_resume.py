"""`copus compare SUITE --resume`: a suite too long for one sitting goes on where it stopped.

A suite's comparison.json is rewritten after every run, so an interrupted suite keeps what
finished. Resumed, it keeps only whole units: the tuning phase when its choice was written
(`chosen_at`, the pre-registration), else every tuning seed all of whose candidates finished; and
every evaluation repeat all of whose entries finished. A unit cut short is run again from its
first run, so the runs of one seed always run back to back, in one sitting, on one machine's
load: pairing stays within a repeat. The suite must be the one that wrote the file: its
definition, experiment and overrides hash to `suite_fingerprint`, and another hash is refused in
one line (a pre-registered suite is never changed after its runs began).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from copus.config import ConfigError, SuiteConfig
from copus.storage import Location


def suite_fingerprint(suite: SuiteConfig, experiment: dict, overrides: list[str]) -> str:
    """What the suite's runs are fixed by: its definition, its experiment, the command's overrides."""
    text = json.dumps(
        {"suite": suite.model_dump(mode="json"), "experiment": experiment, "overrides": overrides},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class ResumePoint:
    """What a resumed suite keeps: the tuning block when its choice was made (else the rows of
    its complete tuning seeds, by seed index), and the rows of its complete repeats."""

    tuning: dict | None = None
    tuning_rows: dict[int, list[dict]] = field(default_factory=dict)
    repeats: dict[int, list[dict]] = field(default_factory=dict)

    def kept(self) -> str:
        tuning = "the tuning choice" if self.tuning else f"{len(self.tuning_rows)} tuning seed(s)"
        return f"kept {tuning} and {len(self.repeats)} complete repeat(s)"


def resume_point(out: Location, fingerprint: str) -> ResumePoint:
    """The resume point of the suite in `out` (an empty one when it has no comparison.json).
    ConfigError when the file is another suite's, or unreadable."""
    path = out / "comparison.json"
    if not path.is_file():
        return ResumePoint()
    try:
        previous = path.read_json()
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: cannot resume from it ({err})") from None
    found = previous.get("suite_fingerprint")
    if found != fingerprint:
        raise ConfigError(
            f"{path}: written by another suite definition (fingerprint {found}, this one {fingerprint}): a suite "
            "is not changed once its runs began; resume with the same suite, experiment and --set, or choose "
            "another output_dir"
        )
    return ResumePoint(
        tuning=_complete_tuning(previous.get("tuning")),
        tuning_rows=_complete_units(previous.get("tuning") or {}, "runs", "run_order"),
        repeats=_complete_units(previous, "runs", "run_order"),
    )


def _complete_tuning(tuning: dict | None) -> dict | None:
    return tuning if tuning and tuning.get("chosen_at") is not None else None


def _complete_units(block: dict, runs_key: str, order_key: str) -> dict[int, list[dict]]:
    """The rows of each unit (tuning seed or evaluation repeat) whose every planned run finished."""
    order = block.get(order_key)
    orders = order.get("repeats") if isinstance(order, dict) else order
    if not orders:
        return {}
    rows: dict[int, list[dict]] = {}
    for row in block.get(runs_key) or []:
        rows.setdefault(row["repeat"], []).append(row)
    return {k: rows[k] for k, planned in enumerate(orders) if len(rows.get(k, [])) == len(planned)}
