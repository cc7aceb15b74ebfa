"""The records the workers send the driver, one dataclass per kind.

Rank 0 of a training worker group (`copus.train.loop`, `copus.cluster.worker`) and of a profiling
one (`copus.train.profile`) reports what happens as records; the driver (MLflow, progress,
OUTPUT_DIR/records.jsonl, run state), the controller and the profiler consume them. They travel
as plain dicts (Ray, records.jsonl, MLflow): a producer builds the dataclass and sends
`as_dict()`, a consumer turns what it receives back into the dataclass with `parse_record`.
`as_dict()` gives the dict, key order included, that the records have always had, so
records.jsonl and what reads it (`copus.core.audit`, the dashboards) see the same lines.

Pure: no torch, no Ray (only `copus.core` types).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from copus.core.layout import CandidateConfig
from copus.core.reconfiguration import Reconfiguration, Relaunch, SwitchOrder


class RecordError(ValueError):
    """A dict that is no record: an unknown kind, or a field missing."""


@dataclass(kw_only=True)
class Record:
    kind: ClassVar[str]
    # Fields a record carries only when they apply: left out of its dict while None.
    OPTIONAL: ClassVar[frozenset[str]] = frozenset()

    def payload(self) -> dict[str, Any]:
        """The record's fields in order, without its kind."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in self.OPTIONAL:
                continue
            out[f.metadata.get("key", f.name)] = value
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.payload()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Record:
        """The record of a dict of this kind; keys that are no field are ignored."""
        names = {f.metadata.get("key", f.name): f.name for f in fields(cls)}
        try:
            return cls(**{names[k]: v for k, v in data.items() if k in names})
        except TypeError as err:  # a required field is missing
            raise RecordError(f"a {cls.kind} record: {err}") from None


@dataclass(kw_only=True)
class StartRecord(Record):
    """A worker group started, fresh or resuming from a checkpoint (after a relaunch, or after
    Ray Train restarted a failed group)."""

    kind: ClassVar[str] = "start"
    step: int
    samples: int
    wall_clock_s: float
    layout: dict  # {"dp", "tp", "pp"}
    gbs: int
    mbs: int
    resumed: bool


@dataclass(kw_only=True)
class StepRecord(Record):
    """One optimiser step (every cluster.report_every_steps). The figures default to None: a
    consumer also reads step records written by hand (tests), which leave some out."""

    kind: ClassVar[str] = "step"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset(
        {
            "gns_sqr",
            "gns_var",
            "b_noise",
            "critical_batch_size",
            "statistical_efficiency",
            "gns_downweighted",
            "gns_sq_small",
            "gns_b_small",
            "gns_sq_big",
            "gns_b_big",
            "sample_ids",
        }
    )
    step: int
    samples: int | None = None
    train_loss: float | None = None
    lr: float | None = None
    gbs: int | None = None
    mbs: int | None = None
    microbatches: int | None = None
    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    step_time_s: float | None = None
    forward_backward_time_s: float | None = None
    dp_allreduce_time_s: float | None = None
    grad_norm_time_s: float | None = None
    optimizer_time_s: float | None = None
    grad_norm: float | None = None
    pipeline_bubble_fraction: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    wall_clock_s: float | None = None
    dp_shard: str = "none"  # the replica's data-parallel sharding and recomputation (CandidateConfig)
    recompute: str = "none"
    # The gradient noise scale's summary, once the estimate has data (GNSEstimator.summary).
    gns_sqr: float | None = None
    gns_var: float | None = None
    b_noise: float | None = None
    critical_batch_size: float | None = None
    statistical_efficiency: float | None = None
    gns_downweighted: float | None = None  # outlier steps weighted down so far (gns.outlier_ratio)
    # The step's own two-batch measurement (squared gradient norms at two batch sizes), so the
    # estimate can be recomputed offline under another horizon (bench/noise_tracking.py).
    gns_sq_small: float | None = None
    gns_b_small: float | None = None
    gns_sq_big: float | None = None
    gns_b_big: float | None = None
    sample_ids: list[int] | None = None  # the global batch's samples (COPUS_RECORD_SAMPLE_IDS=1)

    def config(self) -> CandidateConfig:
        """The layout and batch shape the step was taken in."""
        return CandidateConfig(self.dp, self.tp, self.pp, self.mbs, self.gbs, self.dp_shard, self.recompute)


@dataclass(kw_only=True)
class EvalRecord(Record):
    """The validation loss at a step (samples and timing left out by hand-written records)."""

    kind: ClassVar[str] = "eval"
    step: int
    samples: int | None = None
    val_loss: float
    wall_clock_s: float | None = None
    eval_time_s: float | None = None


@dataclass(kw_only=True)
class CheckpointRecord(Record):
    """A checkpoint every rank has written and handed to storage, and how long that took."""

    kind: ClassVar[str] = "checkpoint"
    step: int
    wall_clock_s: float
    checkpoint_time_s: float  # rank 0's: saving its part and handing the directory to storage
    samples: int | None = None
    branch: bool = False  # the controller asked for it: a probe branches from it (copus.cluster.probes)


@dataclass(kw_only=True)
class CheckpointRefusedRecord(Record):
    """A torn or corrupt checkpoint a resuming group passed over for an older complete one."""

    kind: ClassVar[str] = "checkpoint_refused"
    path: str
    reason: str


@dataclass(kw_only=True)
class NonfiniteRecord(Record):
    """A step whose loss or gradient norm was not finite: no update was made."""

    kind: ClassVar[str] = "nonfinite"
    step: int
    samples: int
    train_loss: float
    grad_norm: float
    wall_clock_s: float
    consecutive: int  # skipped steps in a row, this one included
    nonfinite_steps: int  # skipped steps in the run


@dataclass(kw_only=True)
class ReconfigureRecord(Record):
    """The run changed configuration at a step boundary, in place or by a restart. Its dict
    carries the controller's order (its reasons: `SwitchOrder.reasons()`) between `to` and
    `reshard`, as it always has."""

    kind: ClassVar[str] = "reconfigure"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"reshard", "fell_back"})
    step: int
    samples: int
    wall_clock_s: float
    from_: CandidateConfig = field(metadata={"key": "from"})
    to: CandidateConfig
    order: SwitchOrder | None = None  # why; None for a change nobody ordered
    reshard: dict | None = None  # the in-place reshard's figures (bytes moved, times)
    fell_back: str | None = None  # why the in-place path failed, when it fell back to a restart
    in_place: bool

    def payload(self) -> dict[str, Any]:
        plain = super().payload()
        plain.pop("order")
        plain["from"], plain["to"] = self.from_.as_dict(), self.to.as_dict()
        head = {k: plain.pop(k) for k in ("step", "samples", "wall_clock_s", "from", "to")}
        return {**head, **(self.order.reasons() if self.order else {}), **plain}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReconfigureRecord:
        try:
            to, from_ = CandidateConfig.from_dict(data["to"]), CandidateConfig.from_dict(data["from"])
        except (KeyError, TypeError) as err:
            raise RecordError(f"a reconfigure record: {err}") from None
        record = super().from_dict({**data, "from": from_, "to": to})
        record.order = SwitchOrder.from_reasons(to, data)
        return record

    def reconfiguration(self) -> Reconfiguration:
        """The change as the run's state lists it (its downtime comes with the next step)."""
        return Reconfiguration(
            step=self.step,
            samples=self.samples,
            wall_clock_s=self.wall_clock_s,
            from_=self.from_,
            to=self.to,
            in_place=self.in_place,
            fell_back=self.fell_back,
            reshard=self.reshard,
            order=self.order,
        )


@dataclass
class LoopState:
    """A training run's progress as the loop keeps it: what a checkpoint stores and the end
    record reports. The batch shape and layout are those of the last step taken."""

    step: int = 0
    samples: int = 0
    gbs: int | None = None
    mbs: int | None = None
    time_to_target_s: float | None = None
    best_val_loss: float | None = None
    last_val_loss: float | None = None
    last_val_step: int | None = None
    reconfigure: Relaunch | None = None  # the configuration to relaunch in (stop_reason "reconfigure")
    layout: dict | None = None  # {"dp", "tp", "pp"}
    nonfinite_steps: int = 0
    skipped_samples: int = 0
    reconfigurations: list[Reconfiguration] = field(default_factory=list)  # the workers' own list
    eval_time_s: float = 0.0  # validation time spent so far (all launches)
    time_to_target_without_eval_s: float | None = None  # time to target less the validation before it

    def as_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(LoopState)}

    @classmethod
    def from_saved(cls, saved: dict[str, Any]) -> LoopState:
        """The progress kept in a checkpoint's trainer state (an older one may lack some)."""
        return cls(**_loop_values(saved))


def _plain(value: Any) -> Any:
    """A LoopState value as JSON has it."""
    if isinstance(value, Relaunch | Reconfiguration):
        return value.as_dict()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _loop_values(saved: dict[str, Any]) -> dict[str, Any]:
    """LoopState's fields out of their JSON form."""
    values = {f.name: saved[f.name] for f in fields(LoopState) if f.name in saved}
    if isinstance(values.get("reconfigure"), dict):
        values["reconfigure"] = Relaunch.from_dict(values["reconfigure"])
    values["reconfigurations"] = [
        r if isinstance(r, Reconfiguration) else Reconfiguration.from_dict(r)
        for r in values.get("reconfigurations", [])
    ]
    return values


@dataclass(kw_only=True)
class EndRecord(Record, LoopState):
    """A worker group's loop ended: its final state (what run_training returns) and why."""

    kind: ClassVar[str] = "end"
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"gns"})
    data: dict  # the data stream's position
    wall_clock_s: float
    model_shape: dict
    gns: dict | None = None  # the noise-scale estimator's state, when the run measures it
    stop_reason: str | None

    def payload(self) -> dict[str, Any]:
        return {k: _plain(v) for k, v in super().payload().items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EndRecord:
        return super().from_dict({**data, **_loop_values(data)})


@dataclass(kw_only=True)
class ProfileLayoutRecord(Record):
    """A profiling group builds a layout for the points that follow."""

    kind: ClassVar[str] = "profile_layout"
    layout: list[int]  # [dp, tp, pp]


@dataclass(kw_only=True)
class _ProfileConfigRecord(Record):
    config: dict  # CandidateConfig.as_dict()

    def candidate(self) -> CandidateConfig:
        return CandidateConfig.from_dict(self.config)


@dataclass(kw_only=True)
class ProfileStartRecord(_ProfileConfigRecord):
    """A profiling group starts measuring a configuration."""

    kind: ClassVar[str] = "profile_start"


@dataclass(kw_only=True)
class ProfilePointRecord(_ProfileConfigRecord):
    """A configuration measured: the median of its timed steps, and what was seen."""

    kind: ClassVar[str] = "profile_point"
    step_time_s: float
    step_times: list[float]
    warmup_times: list[float]
    samples_per_s: float
    peak_memory_bytes: float | None  # the slowest rank's peak on a GPU; None on CPUs


@dataclass(kw_only=True)
class ProfileReshardRecord(Record):
    """A profiling group moved its model and optimiser state in place from one layout to the
    next (`copus.train.reshard_in_place`, the path a run's layout change takes): how long it took."""

    kind: ClassVar[str] = "profile_reshard"
    from_: dict = field(metadata={"key": "from"})  # CandidateConfig.as_dict() of the layout left
    to: dict  # ... and of the one built
    seconds: float  # the slowest rank's
    bytes_moved: float  # the slowest rank's


@dataclass(kw_only=True)
class ProbeRecord(Record):
    """The controller measured its critical-batch factor c with a probe (`copus.cluster.probes`):
    a branch from the run's checkpoint at `start_samples` trained at `probe_gbs` while the run
    went on at `run_gbs`; measured when the run reached `step`. `probe_gain`: samples to a
    matched loss at the smaller GBS over those at the larger (None, with `note`, when
    unmeasurable), with its 95% interval; `probe_c_observed`: what that gain alone says c is;
    `belief_c` (its 95% interval `belief_c_low`, `belief_c_high`; `belief_log_c_sd`): the
    controller's belief after it, which its planner now uses."""

    kind: ClassVar[str] = "probe"
    step: int
    wall_clock_s: float
    start_samples: int
    run_gbs: int
    probe_gbs: int
    probe_time_s: float  # the probe's own training time, beside the run's
    b_noise: float | None
    probe_gain: float | None
    probe_gain_low: float | None
    probe_gain_high: float | None
    probe_c_observed: float | None
    belief_c: float
    belief_c_low: float
    belief_c_high: float
    belief_log_c_sd: float
    note: str = ""


RECORD_KINDS: dict[str, type[Record]] = {
    cls.kind: cls
    for cls in (
        StartRecord,
        StepRecord,
        EvalRecord,
        CheckpointRecord,
        CheckpointRefusedRecord,
        NonfiniteRecord,
        ReconfigureRecord,
        EndRecord,
        ProfileLayoutRecord,
        ProfileStartRecord,
        ProfilePointRecord,
        ProfileReshardRecord,
        ProbeRecord,
    )
}


def parse_record(data: dict[str, Any]) -> Record:
    """The record a dict (as a worker sent it) stands for, by its kind."""
    cls = RECORD_KINDS.get(data.get("kind"))
    if cls is None:
        raise RecordError(f"unknown record kind {data.get('kind')!r}")
    return cls.from_dict(data)
