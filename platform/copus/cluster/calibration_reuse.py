"""Reuse the continuations of an earlier calibration: `copus calibrate EXP --reuse-points FILE`.

The continuations (every branch point × GBS × seed trained to the decrement) are nearly all of a
calibration's cost, and they depend on the model, the optimiser, its LR rule and the schedule,
not on the noise estimator: only the factor c = B_crit / (the run's live estimate) does. So when
the estimator changes (`gns.horizon`, its share or floor), or the calibration is carried to
another machine whose stdlib corpus differs (the `stdlib` dataset is the machine's Python
standard library, so its fingerprint depends on the Python version), the points of FILE are taken
over and only the reference run is repeated: its branch checkpoints give the noise scales under
the current estimator, and the fit gives c against them.

What is checked: FILE is a calibration (`calibration_problem`); its model, sequence length,
optimiser, schedule and noise pre-conditioning are the experiment's; its grid, branch points and
decrement are the experiment's calibration settings; the LR rule does not read the estimate
(`adascale` does, so its continuations depend on the estimator and cannot be reused). A data
fingerprint that differs is allowed and said, and recorded in the result (`settings.points_from`).
"""

from __future__ import annotations

from pathlib import Path

from copus.config import ConfigError, ExperimentConfig
from copus.core.calibration import calibration_problem
from copus.storage import Location

# What the continuations depend on, besides the data: these parts of the key must be equal.
_SAME = ("schema_version", "kind", "optimizer", "schedule")


def _same_settings(settings: dict, theirs: dict, source: str) -> None:
    for name in ("gbs", "branch_samples", "decrement", "seeds", "val_samples", "eval_every_samples"):
        if theirs.get(name) != settings[name]:
            raise ConfigError(
                f"calibration.{name}: {settings[name]} here, {theirs.get(name)} in {source}: its points were "
                f"measured otherwise (--set calibration.{name}=... to match)"
            )


def _same_key(key: dict, theirs: dict, source: str) -> None:
    differs = [k for k in _SAME if theirs.get(k) != key[k]]
    mine, other = key["workload"], theirs.get("workload") or {}
    differs += [f"workload.{k}" for k in ("model", "seq_len") if other.get(k) != mine[k]]
    if (theirs.get("gns") or {}).get("precondition") != key["gns"]["precondition"]:
        differs.append("gns.precondition")
    if differs:
        raise ConfigError(f"{source}: made for another {differs[0]} than this experiment's; its points do not apply")


def load_reusable(cfg: ExperimentConfig, key: dict, settings: dict, path: str) -> dict:
    """FILE's calibration, checked against this experiment (module docstring)."""
    if cfg.optimizer.lr_scaling == "adascale":
        raise ConfigError(
            "optimizer.lr_scaling: adascale reads the noise estimate during continuations; "
            "they cannot be reused under another estimator"
        )
    where = Location.parse(path)
    if not where.is_file():
        raise ConfigError(f"{path}: no such calibration file")
    try:
        data = where.read_json()
    except (UnicodeDecodeError, ValueError) as err:
        raise ConfigError(f"{path}: not JSON ({type(err).__name__})") from None
    problem = calibration_problem(data)
    if problem or not isinstance(data.get("points"), list) or not data["points"]:
        raise ConfigError(f"{path}: not a calibration with points ({problem or 'points: none'})")
    _same_key(key, data["key"], path)
    _same_settings(settings, data.get("settings") or {}, path)
    return data


def imported_points(data: dict, branch_samples: list[int], source: str) -> list[dict]:
    """FILE's points in the form the work folder keeps (`Calibration.record_point`): each starts
    from the branch's loss it was measured from, and says where it came from."""
    out = []
    for p in data["points"]:
        samples = p.get("samples")
        out.append(
            {
                "branch": p["branch"],
                "gbs": p["gbs"],
                "seed": p["seed"],
                "start": {"samples": branch_samples[p["branch"]], "val_loss": p["val_loss"]},
                "samples": float("nan") if samples is None else samples,
                "steps": float("nan") if p.get("steps") is None else p["steps"],
                "reached": bool(p.get("reached")),
                "refined": p.get("refined"),
                "unmeasurable": p.get("unmeasurable"),
                "wall_clock_s": 0.0,
                "curve_samples": [],
                "curve_val_loss": [],
                "imported_from": source,
                **({} if p.get("lr_factor", 1.0) == 1.0 else {"lr_factor": p["lr_factor"]}),
            }
        )
    return out


def provenance(data: dict, path: str) -> dict:
    """What the result records of the points' origin (settings.points_from)."""
    return {
        "file": Path(path).name,
        "id": data.get("id"),
        "data": (data["key"].get("workload") or {}).get("data"),
        "crossing": (data.get("settings") or {}).get("crossing"),
        "wall_clock_s": data.get("wall_clock_s"),
    }
