"""The controller's probes: measuring its critical-batch factor c during the run.

When the decision hangs on c (`copus.core.probing`), the controller asks the workers for a
branch checkpoint at the next step boundary (`BranchRequest`). When its record arrives a probe
starts: a one-process Ray task (`copus.train.probe`) that copies the checkpoint (Ray Train may
delete it once newer ones exist), trains from it at the probe's GBS and returns its per-step
losses, while the run goes on from the same checkpoint at its own GBS. Once both curves are as
long as the probe (or the run changed its GBS), `copus.core.counterfactual.counterfactual_gain`
sets them against each other at matched loss, and the belief about c takes the measurement in
(`copus.core.belief`): the planner from then on uses the belief's c. The probe's compute shares
the machine with the run, so it is part of the run's time to target.

State kept in the controller's state file: the belief, the samples at which probes started, and
a measurement waiting for the run's own curve. A probe still training when the controller
restarts is lost. A probe that fails, or whose checkpoint is gone, gives a record with its
reason and leaves the belief as it was; at the run's end a probe still training is waited for
(`Controller.settle_probes`) and measured against the run's curve as far as it went.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import ray

from copus.core.belief import FactorBelief
from copus.core.counterfactual import counterfactual_gain
from copus.core.probing import ProbeSettings, probe_due, probe_length, run_curve_complete, run_curve_since
from copus.records import ProbeRecord
from copus.storage import Location, local_copy
from copus.train.worker_plan import WorkerPlan

# Why a probe that would pay was not made on a GPU cluster.
NO_DEVICE_FOR_PROBE = "no GPU free beside the run's workers"


def probe_options(use_gpu: bool) -> dict:
    """A probe's Ray resources. No CPU: it shares the run's cores (the run's workers hold them).
    On a GPU cluster one GPU of its own: a GPU a worker holds cannot be shared, and a Ray task
    without a GPU sees none (it would train on the CPU)."""
    return {"num_cpus": 0, "num_gpus": 1 if use_gpu else 0}


def gpu_free(available: dict) -> bool:
    """Whether Ray has a whole GPU no task or worker holds (`ray.available_resources()`)."""
    return available.get("GPU", 0.0) >= 1.0


@dataclass(frozen=True)
class ProbeSource:
    """What a probe trains from: the run's worker plan and where Ray Train keeps its checkpoints."""

    plan: WorkerPlan
    checkpoint_root: Location


def _probe_task(plan: WorkerPlan, checkpoint: Location, gbs: int, samples: int) -> dict:
    """On a Ray worker: copy the branch checkpoint, train the probe from the copy."""
    import torch

    from copus.train.probe import run_probe

    torch.set_num_threads(1)  # beside the run's workers, not over them
    with tempfile.TemporaryDirectory(prefix="copus-probe-") as tmp:
        with local_copy(checkpoint) as local:
            copy = Path(shutil.copytree(local, Path(tmp) / "checkpoint"))
        t = time.perf_counter()
        out = run_probe(plan, copy, gbs, samples)
    return {**out, "probe_time_s": time.perf_counter() - t}


def find_branch_checkpoint(root: Location, step: int) -> Location | None:
    """The run's checkpoint written at `step` (newest first: it is usually the newest)."""
    # Imported here: copus.train.checkpoint imports torch (2 s of CPU), which the controller
    # actor that holds this module needs for nothing else.
    from copus.train.checkpoint import checkpoint_dirs, read_trainer_state

    for candidate in checkpoint_dirs(root):
        with local_copy(candidate) as local:
            try:
                if int(read_trainer_state(local)["step"]) == step:
                    return candidate
            except (FileNotFoundError, ValueError, KeyError):
                continue
    return None


class Probes:
    """The probes of one run: the one asked for or training, the measurement waiting for the
    run's own curve, and the belief about c they update."""

    def __init__(self, settings: ProbeSettings, source: ProbeSource, prior_c: float):
        self.settings, self.source = settings, source
        self.belief = FactorBelief.prior(prior_c, settings.prior_sd)
        self.started: list[int] = []  # samples at which probes started
        self.wanted: int | None = None  # the GBS of a probe whose branch checkpoint is asked for
        self.wanted_b_noise = float("nan")  # the noise scale of the decision that wanted it
        self.asked = False  # the request went to rank 0
        self.running = None  # (ObjectRef, where it started) of a probe in training
        self.finished: dict | None = None  # a probe's result waiting for the run's own curve

    def busy(self) -> bool:
        return self.wanted is not None or self.running is not None or self.finished is not None

    def device_free(self) -> bool:
        """Whether a probe could train now: on a GPU cluster only on a GPU no worker holds."""
        return not self.source.plan.use_gpu or gpu_free(ray.available_resources())

    def may_start(self, samples: int) -> bool:
        return not self.busy() and probe_due(self.settings, samples, self.started)

    def want(self, gbs: int, b_noise: float) -> None:
        """Ask for a probe at `gbs`; `b_noise`: the noise scale its decision saw, which the
        measurement is read at (copus.core.belief.ratio_of_factor)."""
        self.wanted, self.wanted_b_noise, self.asked = gbs, b_noise, False

    def branch_request(self) -> bool:
        """Whether to ask rank 0 for a branch checkpoint now (once per probe)."""
        if self.wanted is None or self.asked:
            return False
        self.asked = True
        return True

    def launch(self, step: int, samples: int, run_gbs: int, wall_clock_s: float) -> ProbeRecord | None:
        """The branch checkpoint at `step` is written: start the probe from it. A record when it
        cannot start (the checkpoint is not found), else None."""
        gbs, self.wanted = self.wanted, None
        if gbs is None:
            return None
        where = find_branch_checkpoint(self.source.checkpoint_root, step)
        if where is None:
            note = f"not started: the branch checkpoint of step {step} is not in {self.source.checkpoint_root}"
            return self.unmeasured(step, wall_clock_s, samples, run_gbs, gbs, note)
        length = probe_length(self.settings, samples, gbs, run_gbs)
        task = ray.remote(_probe_task).options(**probe_options(self.source.plan.use_gpu))
        ref = task.remote(self.source.plan, where, gbs, length)
        started = {"start_samples": samples, "gbs": gbs, "run_gbs": run_gbs, "b_noise": self.wanted_b_noise}
        self.running = (ref, {**started, "length": length})
        self.started.append(samples)
        return None

    def collect(self, step: int, wall_clock_s: float) -> ProbeRecord | None:
        """A probe that finished training becomes a measurement waiting for the run's own curve;
        one that failed, a record saying so (a failed probe costs its measurement, never the run)."""
        if self.running is None:
            return None
        ref, started = self.running
        done, _ = ray.wait([ref], timeout=0)
        if not done:
            return None
        self.running = None
        try:
            result = ray.get(ref)
        except Exception as err:
            note = f"failed: {type(err).__name__}: {err}".splitlines()[0]
            s = started
            return self.unmeasured(step, wall_clock_s, s["start_samples"], s["run_gbs"], s["gbs"], note)
        self.finished = {**result, **started}
        return None

    def measure(self, history: list[dict], step: int, wall_clock_s: float, ended: bool = False) -> ProbeRecord | None:
        """Once the run's own curve from the probe's checkpoint is complete (or the run `ended`:
        as far as it went): the gain, the belief updated with it, and the record saying so."""
        f = self.finished
        if f is None or not (ended or run_curve_complete(history, f["start_samples"], f["length"])):
            return None
        self.finished = None
        run_s, run_loss, run_gbs = run_curve_since(history, f["start_samples"], f["length"])
        probe = (f["samples"], f["train_loss"])
        run = (run_s, run_loss)
        small, large = (probe, run) if f["gbs"] < run_gbs else (run, probe)
        gain = counterfactual_gain(large, small, f["start_samples"])
        b_small, b_large = sorted((f["gbs"], run_gbs))
        note = gain.note
        if gain.rho is not None:  # the counterfactual's words are a switch's; a probe's are its two batches
            note = (
                f"to the matched loss {gain.level:.4g}: {gain.samples_counterfactual:.0f} samples at GBS {b_small}, "
                f"{gain.samples_switched:.0f} at GBS {b_large}"
            )
        usable = gain.rho is not None and gain.interval is not None and min(gain.interval) > 0
        if usable and _positive(f["b_noise"]) and b_small < b_large:
            low, high = gain.interval
            self.belief = self.belief.observed_ratio(
                gain.rho,
                low,
                high,
                f["b_noise"],
                b_small,
                b_large,
                f["start_samples"],
                self.settings.drift_sd,
                note={"probe_time_s": f["probe_time_s"]},
            )
            observed = self.belief.observations[-1].get("c_observed")
        else:
            observed = None
            note = f"not used: {note}" if gain.rho is None else f"not used (noise scale {f['b_noise']}): {note}"
        return self.record(step, wall_clock_s, f, run_gbs, gain, observed, note)

    def record(self, step, wall_clock_s, f, run_gbs, gain, observed, note) -> ProbeRecord:
        low, high = gain.interval if gain.interval is not None else (None, None)
        observed = observed if observed is not None and math.isfinite(observed) else None
        base = self.unmeasured(
            step, wall_clock_s, f["start_samples"], run_gbs, f["gbs"], note, f["probe_time_s"], f["b_noise"]
        )
        return replace(base, probe_gain=gain.rho, probe_gain_low=low, probe_gain_high=high, probe_c_observed=observed)

    def unmeasured(
        self, step, wall_clock_s, start_samples, run_gbs, probe_gbs, note, probe_time_s=0.0, b_noise=None
    ) -> ProbeRecord:
        """A probe record without a measurement (the belief as it stands), `note` saying why."""
        c_low, c_high = self.belief.interval()
        return ProbeRecord(
            step=step,
            wall_clock_s=wall_clock_s,
            start_samples=start_samples,
            run_gbs=run_gbs,
            probe_gbs=probe_gbs,
            probe_time_s=probe_time_s,
            b_noise=b_noise if _positive(b_noise) else None,
            probe_gain=None,
            probe_gain_low=None,
            probe_gain_high=None,
            probe_c_observed=None,
            belief_c=self.belief.factor,
            belief_c_low=c_low,
            belief_c_high=c_high,
            belief_log_c_sd=self.belief.sd,
            note=note,
        )

    def settle(self, timeout_s: float) -> None:
        """At the run's end: wait up to `timeout_s` for a probe still training."""
        if self.running is not None:
            ray.wait([self.running[0]], timeout=timeout_s)

    def state(self) -> dict:
        return {"belief": self.belief.as_dict(), "started": self.started, "finished": self.finished}

    def recover(self, saved: dict) -> None:
        """A restarted controller's probes: a probe that was training is lost (its task's
        result went with the old actor), and one asked for but not started is forgotten (a later
        decision may ask again); a measurement waiting for the run's curve is kept."""
        self.belief = FactorBelief.from_dict(saved["belief"])
        self.started, self.finished = list(saved["started"]), saved.get("finished")


def _positive(x) -> bool:
    return x is not None and math.isfinite(x) and x > 0
