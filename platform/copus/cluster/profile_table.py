"""The profile table: measured step times (and infeasible configurations) of one workload on
one kind of hardware at one world size, as one versioned JSON file.

The key (workload, hardware description, world size) names the file, so later runs of the
same key find and extend it instead of measuring again. The fitted step-time model and its
cross-validated error travel in the same file. Writes are atomic (temp file + rename): a
crash mid-profile leaves the previous complete table, never half a file.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from copus.core.finite import positive_number
from copus.core.layout import CandidateConfig, ModelShape
from copus.core.memory import MemoryBreakdown
from copus.core.throughput import (
    Measurement,
    StepTimeModel,
    StepTimeParams,
    cross_validate,
    fit_step_time_model,
)
from copus.storage import Location

SCHEMA_VERSION = 1


class ProfileTableError(ValueError):
    pass


def profile_key(workload: dict, hardware: dict, world_size: int) -> dict:
    return {"schema_version": SCHEMA_VERSION, "workload": workload, "hardware": hardware, "world_size": world_size}


def key_id(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


ROW_FIELDS = ("dp", "tp", "pp", "mbs", "gbs")


def row_problem(row) -> str | None:
    """Why `row` is not a profile-table row (None when it is): a configuration of positive sizes,
    a status, and for a measured one a positive step time."""
    if not isinstance(row, dict):
        return "a row is not a mapping"
    sizes = [row.get(k) for k in ROW_FIELDS]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in sizes):
        return f"a row's {'/'.join(ROW_FIELDS)} are not positive integers"
    if row.get("status") not in ("ok", "infeasible"):
        return f"a row's status is {row.get('status')!r}"
    time_s = row.get("step_time_s")
    if row["status"] == "ok" and not positive_number(time_s):
        return f"a measured row's step_time_s is {time_s!r}"
    return None


def table_problem(data, complete: bool = False) -> str | None:
    """Why `data` is not a profile table's rows (None when it is); `complete`: nor a whole table
    as `ProfileTable.load` reads it (key, creation time, fitted model)."""
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        return "no rows"
    if complete and not (
        isinstance(data.get("key"), dict)
        and isinstance(data.get("created"), (int, float))
        and isinstance(data.get("model") or {}, dict)
    ):
        return "key, created or model is damaged"
    reshards = data.get("reshards", [])
    if not isinstance(reshards, list) or not all(map(_is_reshard, reshards)):
        return "reshards is damaged"
    return next((p for p in map(row_problem, data["rows"]) if p), None)


def _is_reshard(entry) -> bool:
    """A measured in-place layout change: the layouts left and built, and its positive seconds."""
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("from"), dict)
        and isinstance(entry.get("to"), dict)
        and positive_number(entry.get("seconds"))
    )


@dataclass
class ProfileTable:
    key: dict
    rows: list[dict] = field(default_factory=list)  # one per configuration: status ok | infeasible
    model: dict | None = None  # fitted StepTimeModel.as_dict() and its error
    created: float = field(default_factory=time.time)
    # in-place layout changes the profile made between its layouts: {"from", "to", "seconds", "bytes_moved"}
    reshards: list[dict] = field(default_factory=list)

    @property
    def id(self) -> str:
        return key_id(self.key)

    def file_name(self) -> str:
        return f"profile-{self.id}.json"

    # --- rows -------------------------------------------------------------------------
    def row(self, cfg: CandidateConfig) -> dict | None:
        for r in self.rows:
            if CandidateConfig.from_dict(r) == cfg:
                return r
        return None

    def record(self, cfg: CandidateConfig, **values) -> dict:
        """Add or replace the row of `cfg` (a re-measurement replaces the old figure)."""
        row = {
            "dp": cfg.dp,
            "tp": cfg.tp,
            "pp": cfg.pp,
            "mbs": cfg.mbs,
            "gbs": cfg.gbs,
            "microbatches": cfg.microbatches,
            "recorded_at": time.time(),
            **values,
        }
        self.rows = [r for r in self.rows if CandidateConfig.from_dict(r) != cfg] + [row]
        return row

    def measured(self) -> list[Measurement]:
        return [Measurement(CandidateConfig.from_dict(r), r["step_time_s"]) for r in self.rows if r["status"] == "ok"]

    def infeasible(self) -> list[dict]:
        return [r for r in self.rows if r["status"] == "infeasible"]

    def known(self, cfg: CandidateConfig) -> bool:
        return self.row(cfg) is not None

    # --- layout changes -------------------------------------------------------------------
    def record_reshard(self, left: CandidateConfig, built: CandidateConfig, seconds: float, bytes_moved: float) -> None:
        self.reshards.append(
            {"from": left.as_dict(), "to": built.as_dict(), "seconds": seconds, "bytes_moved": bytes_moved}
        )

    def in_place_reshard_s(self) -> float | None:
        """What an in-place layout change took in this profile (the median of those it made), the
        planner's figure for a run's first one; None when it made none."""
        return statistics.median(r["seconds"] for r in self.reshards) if self.reshards else None

    # --- memory -------------------------------------------------------------------------
    def memory_calibration(self) -> float:
        """How far the memory model under-estimated measured peaks (>= 1; 1 when nothing was
        measured): applied to configurations not profiled."""
        ratios = [
            r["peak_memory_bytes"] / r["model_memory_bytes"]
            for r in self.rows
            if r["status"] == "ok" and r.get("peak_memory_bytes") and r.get("model_memory_bytes")
        ]
        return max([1.0, *ratios])

    def feasible(self, cfg: CandidateConfig, predicted: MemoryBreakdown, usable_bytes: float) -> tuple[bool, str]:
        """Measured outcomes win over the memory model; unmeasured ones use the calibrated model."""
        row = self.row(cfg)
        if row is not None and row.get("source") == "measured":
            return row["status"] == "ok", row.get("reason", "")
        need = predicted.total * self.memory_calibration()
        if need <= usable_bytes:
            return True, ""
        return False, f"memory model: {need / 2**30:.2f} GiB per rank > {usable_bytes / 2**30:.2f} GiB usable"

    # --- model --------------------------------------------------------------------------
    def fit(self, shape: ModelShape, folds: int) -> dict:
        """Fit the step-time model to every measured point and measure its error on points it
        did not see (k-fold); both are stored in the table. Returns the model entry."""
        points = self.measured()
        if len(points) < 2:
            raise ProfileTableError(
                f"{len(points)} measured configuration(s): the step-time model needs at least 2 "
                "(raise profile.budget_s)"
            )
        model = fit_step_time_model(points, shape)
        report = cross_validate(points, shape, folds)
        for p, pred, ape in zip(points, report.predicted, report.ape):
            self.row(p.config).update(
                {"cv_predicted_step_time_s": pred, "cv_ape": ape, "fitted_step_time_s": model.step_time(p.config)}
            )
        self.model = {**model.as_dict(), "error": report.as_dict(), "fitted_on": len(points)}
        return self.model

    def step_time_model(self, shape: ModelShape) -> StepTimeModel | None:
        if self.model is None:
            return None
        seen = {k: tuple(v) for k, v in self.model.get("seen", {}).items()} or None
        return StepTimeModel(StepTimeParams.from_dict(self.model["params"]), shape, seen)

    # --- file ---------------------------------------------------------------------------
    def as_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "key": self.key,
            "key_id": self.id,
            "created": self.created,
            "updated": time.time(),
            "rows": self.rows,
            "model": self.model,
            "reshards": self.reshards,
        }

    def save(self, directory: Location | Path) -> Location:
        path = Location.parse(directory) / self.file_name()
        path.write_json(self.as_dict())
        return path

    @classmethod
    def load(cls, path: Location | Path) -> "ProfileTable":
        try:
            data = Location.parse(path).read_json()
        except (OSError, UnicodeDecodeError, ValueError) as err:
            raise ProfileTableError(f"{path}: not a readable profile table ({err})") from None
        version = data.get("schema_version") if isinstance(data, dict) else None
        if version != SCHEMA_VERSION:
            raise ProfileTableError(
                f"{path}: schema_version {version!r}, this COPUS reads {SCHEMA_VERSION}; profile again with --refresh"
            )
        problem = table_problem(data, complete=True)
        if problem:
            raise ProfileTableError(f"{path}: a damaged profile table ({problem}); profile again with --refresh")
        return cls(
            key=data["key"],
            rows=data["rows"],
            model=data.get("model"),
            created=data["created"],
            reshards=data.get("reshards", []),
        )

    @classmethod
    def open(cls, directory: Location | Path, key: dict, refresh: bool = False) -> "ProfileTable":
        """The table of `key` in `directory`, or a new empty one (always a new one with refresh)."""
        table = cls(key=key)
        path = Location.parse(directory) / table.file_name()
        if path.is_file() and not refresh:
            loaded = cls.load(path)
            if loaded.key != key:
                raise ProfileTableError(f"{path}: holds another key than its name says; remove it or use --refresh")
            return loaded
        return table
