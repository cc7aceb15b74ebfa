"""The emulated cluster's link rate on this machine. `cluster.emulate.link_mbit` is the rate as
configured; with `cluster.emulate.compute_reference_s` it is the rate for a machine whose
reference step (copus.train.reference_step) computed in that many seconds, and on this machine
it is scaled by that over the step measured here. The all-reduce time goes as 1/rate and the
compute as the step, so their ratio, which decides where data parallelism across nodes pays,
stays what it was where the rate was chosen, on a faster or slower CPU alike.

The measurement is kept per machine, CPU model and workload in ~/.cache/copus (COPUS_CACHE_DIR
overrides), so every run of a suite on one machine sees the same rate; with
`cluster.emulate.compute_reference_every: run` it is measured again at the start of every run
and profile and the links re-capped (`relink`), for a machine whose speed drifts."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from copus.config import ExperimentConfig


@dataclass(frozen=True)
class LinkRate:
    """The rate the links are capped at, and where it came from."""

    link_mbit: float  # the rate on this machine
    configured_mbit: float  # cluster.emulate.link_mbit
    reference_step_s: float | None  # cluster.emulate.compute_reference_s (None: not scaled)
    measured_step_s: float | None  # the reference step on this machine (None: not scaled)

    def as_dict(self) -> dict:
        return asdict(self)


def scaled_link_mbit(configured_mbit: float, reference_step_s: float, measured_step_s: float) -> float:
    """The rate that keeps all-reduce / compute: a machine computing twice as fast gets twice
    the rate. Rounded to 0.1 Mbit/s so that the rate reads the same in every record."""
    return round(configured_mbit * reference_step_s / measured_step_s, 1)


def reference_shape(cfg: ExperimentConfig):
    """(flavour, seq_len, samples) of the reference step: one rank's share of the all-data-
    parallel layout at the reference GBS, as bench/link_rate.py's ratio defines compute."""
    gbs = cfg.optimizer.reference_gbs or cfg.batch.gbs
    return cfg.flavour(), cfg.workload.seq_len, max(1, gbs // cfg.cluster.num_workers)


def link_rate(cfg: ExperimentConfig) -> LinkRate:
    """The link rate of cfg's emulated cluster on this machine (measuring the reference step
    once per machine and workload when cluster.emulate.compute_reference_s asks for it)."""
    e = cfg.cluster.emulate
    configured = float(e.link_mbit)
    if e.compute_reference_s is None:
        return LinkRate(configured, configured, None, None)
    measured = measured_reference_step_s(cfg)
    return LinkRate(
        scaled_link_mbit(configured, e.compute_reference_s, measured), configured, e.compute_reference_s, measured
    )


# Measured in this process, by cache file: every caller of one process sees one rate, even where
# the cache cannot be written.
_MEASURED: dict[Path, float] = {}


def measured_reference_step_s(cfg: ExperimentConfig, fresh: bool = False) -> float:
    """This machine's reference step for cfg's workload: what this process measured, else the
    cache's, else measured now; `fresh`: measured now whatever is kept (and kept after)."""
    flavour, seq_len, samples = reference_shape(cfg)
    path = _cache_path(flavour, seq_len, samples)
    if not fresh:
        if path in _MEASURED:
            return _MEASURED[path]
        try:
            return _MEASURED.setdefault(path, float(json.loads(path.read_text())["reference_step_s"]))
        except (OSError, ValueError, KeyError, TypeError):
            pass
    from copus.train.reference_step import reference_step_s  # torch: only when measuring

    seconds = _MEASURED[path] = reference_step_s(flavour, seq_len, samples)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"reference_step_s": seconds, "key": _cache_key(flavour, seq_len, samples)}))
        tmp.replace(path)  # whole or not at all: a reader never sees half a file
    except OSError:
        pass  # an unwritable cache: this process keeps its measurement, the next measures again
    return seconds


def relink(cfg: ExperimentConfig, echo: Callable[[str], None]) -> LinkRate | None:
    """Under `cluster.emulate.compute_reference_every: run`, at the start of a run or profile:
    the reference step measured again and the links of the emulated cluster that is up re-capped
    at the rate it gives, so that a machine whose compute drifts over a suite's hours keeps the
    all-reduce/compute ratio in every run (one rate for a run: it is not re-capped mid-run).
    The cache keeps the new step, so a later process describes the cluster as it now is. None
    (nothing done) for the other setting, or when no cluster of cfg's is up here."""
    from copus.cluster import emulate  # its ip/tc commands; no ray

    e = cfg.cluster.emulate
    if e is None or e.compute_reference_every != "run":
        return None
    state = emulate.status(e.state_dir)
    if state is None or not state["healthy"]:
        return None
    before = float(state["spec"]["link_mbit"])
    measured_reference_step_s(cfg, fresh=True)
    rate = link_rate(cfg)
    if rate.link_mbit != before:
        emulate.reshape(e.state_dir, rate.link_mbit)
    echo(
        f"links: {rate.link_mbit:g} Mbit/s (was {before:g}): the reference step read {rate.measured_step_s:.4f} s "
        f"here, {e.compute_reference_s:g} s where {e.link_mbit:g} Mbit/s was chosen"
    )
    return rate


def link_key(cfg: ExperimentConfig) -> dict:
    """How an emulated cluster's link enters the key of a profile measured over it: the rate
    itself, or, where every run re-caps it (compute_reference_every: run), the ratio it keeps
    (the configured rate at its reference step), so that every run of a suite reads one table."""
    e = cfg.cluster.emulate
    if e.compute_reference_every == "run":
        return {"link_mbit_at_reference": float(e.link_mbit), "compute_reference_s": e.compute_reference_s}
    return {"link_mbit": link_rate(cfg).link_mbit}


def _cache_key(flavour, seq_len: int, samples: int) -> dict:
    import torch

    from copus.train.host import cpu_model

    return {
        "host": platform.node(),
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "flavour": asdict(flavour),
        "seq_len": seq_len,
        "samples": samples,
    }


def _cache_path(flavour, seq_len: int, samples: int) -> Path:
    root = Path(os.environ.get("COPUS_CACHE_DIR") or Path.home() / ".cache" / "copus")
    key = json.dumps(_cache_key(flavour, seq_len, samples), sort_keys=True, default=str)
    return root / "reference-step" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
