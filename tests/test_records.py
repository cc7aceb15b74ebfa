"""The typed records give back exactly the dicts the workers have always sent (keys, values,
order), so records.jsonl, MLflow and summary.json keep their shape."""

from __future__ import annotations

import pytest

from copus.core.layout import CandidateConfig
from copus.core.reconfiguration import Reconfiguration, SwitchOrder
from copus.records import RECORD_KINDS, EndRecord, ReconfigureRecord, RecordError, StepRecord, parse_record

CONFIG = {"dp": 2, "tp": 1, "pp": 1, "mbs": 2, "gbs": 8, "dp_shard": "none", "recompute": "none"}
STEP = {
    "kind": "step",
    "step": 3,
    "samples": 24,
    "train_loss": 2.5,
    "lr": 1e-3,
    "gbs": 8,
    "mbs": 2,
    "microbatches": 2,
    "dp": 2,
    "tp": 1,
    "pp": 1,
    "step_time_s": 0.5,
    "forward_backward_time_s": 0.3,
    "dp_allreduce_time_s": 0.1,
    "grad_norm_time_s": 0.01,
    "optimizer_time_s": 0.05,
    "grad_norm": 1.2,
    "pipeline_bubble_fraction": 0.0,
    "samples_per_s": 16.0,
    "tokens_per_s": 512.0,
    "wall_clock_s": 9.0,
    "dp_shard": "none",
    "recompute": "none",
}
GNS = {"gns_sqr": 1.0, "gns_var": 4.0, "b_noise": 4.0, "critical_batch_size": 8.0, "statistical_efficiency": 0.9}
END = {
    "kind": "end",
    "step": 6,
    "samples": 48,
    "gbs": 8,
    "mbs": 2,
    "time_to_target_s": None,
    "best_val_loss": 2.0,
    "last_val_loss": 2.1,
    "last_val_step": 6,
    "reconfigure": None,
    "layout": {"dp": 2, "tp": 1, "pp": 1},
    "nonfinite_steps": 0,
    "skipped_samples": 0,
    "reconfigurations": [],
    "eval_time_s": 0.5,
    "time_to_target_without_eval_s": None,
    "data": {"samples_consumed": 48},
    "wall_clock_s": 12.0,
    "model_shape": {"dim": 64},
    "stop_reason": "max_steps",
}
# What the controller's SwitchOrder puts in a reconfigure record (every field, in order).
ORDER_REASONS = {
    "change": "gbs",
    "cost_s": 0.0,
    "reason": "goodput",
    "b_noise": 40.0,
    "predicted_gain": 0.2,
    "predicted_goodput": 120.0,
    "current_predicted_goodput": 100.0,
    "predicted_throughput": 150.0,
    "predicted_efficiency": 0.8,
    "current_predicted_efficiency": 1.0,
    "predicted_efficiency_gain": 0.8,
    "critical_batch": 80.0,
    "val_loss": 2.5,
    "efficiency_source": "configured",
    "way": "auto",
    "rule": "quantile",
    "gain_low": 0.05,
    "gain_log_sd": 0.12,
    "transient_s": 1.5,
    "horizon_s": 600.0,
    "horizon_source": "target",
}
RECORDS = [
    {
        "kind": "start",
        "step": 0,
        "samples": 0,
        "wall_clock_s": 1.0,
        "layout": {"dp": 2, "tp": 1, "pp": 1},
        "gbs": 8,
        "mbs": 2,
        "resumed": False,
    },
    STEP,
    {**STEP, **GNS, "sample_ids": [0, 1, 2]},
    {"kind": "eval", "step": 3, "samples": 24, "val_loss": 2.4, "wall_clock_s": 9.5, "eval_time_s": 0.2},
    {"kind": "checkpoint", "step": 3, "wall_clock_s": 10.0, "checkpoint_time_s": 0.4, "samples": 24, "branch": True},
    {"kind": "checkpoint_refused", "path": "/ckpt/step3", "reason": "no COMPLETE marker"},
    {
        "kind": "nonfinite",
        "step": 4,
        "samples": 32,
        "train_loss": float("nan"),
        "grad_norm": float("inf"),
        "wall_clock_s": 11.0,
        "consecutive": 1,
        "nonfinite_steps": 1,
    },
    {
        "kind": "reconfigure",
        "step": 5,
        "samples": 40,
        "wall_clock_s": 11.5,
        "from": CONFIG,
        "to": {**CONFIG, "gbs": 16},
        **ORDER_REASONS,
        "in_place": True,
    },
    {
        "kind": "reconfigure",
        "step": 5,
        "samples": 40,
        "wall_clock_s": 11.5,
        "from": CONFIG,
        "to": {**CONFIG, "dp": 1, "pp": 2},
        "fell_back": "ReshardFailed: another rank failed",
        "in_place": False,
    },
    END,
    {**{k: v for k, v in END.items() if k != "stop_reason"}, "gns": {"ema_sqr": 1.0}, "stop_reason": "reconfigure"},
    {"kind": "profile_layout", "layout": [2, 1, 1]},
    {"kind": "profile_start", "config": CONFIG},
    {
        "kind": "profile_point",
        "config": CONFIG,
        "step_time_s": 0.5,
        "step_times": [0.5, 0.5],
        "warmup_times": [0.9],
        "samples_per_s": 16.0,
        "peak_memory_bytes": None,
    },
    {"kind": "profile_reshard", "from": CONFIG, "to": {**CONFIG, "dp": 1, "pp": 2}, "seconds": 0.4, "bytes_moved": 1e7},
    {
        "kind": "probe",
        "step": 60,
        "wall_clock_s": 30.0,
        "start_samples": 320,
        "run_gbs": 16,
        "probe_gbs": 64,
        "probe_time_s": 9.5,
        "b_noise": 12.0,
        "probe_gain": 0.7,
        "probe_gain_low": 0.55,
        "probe_gain_high": 0.9,
        "probe_c_observed": 2.6,
        "belief_c": 2.5,
        "belief_c_low": 1.2,
        "belief_c_high": 5.1,
        "belief_log_c_sd": 0.37,
        "note": "against a counterfactual at matched loss 2.9",
    },
]


@pytest.mark.parametrize("raw", RECORDS, ids=lambda r: r["kind"])
def test_a_record_gives_back_the_dict_it_was_parsed_from(raw):
    record = parse_record(raw)
    assert type(record) is RECORD_KINDS[raw["kind"]]
    assert list(record.as_dict().items()) == list(raw.items())  # the same NaN objects compare equal


def test_every_kind_is_covered_and_typed():
    assert {r["kind"] for r in RECORDS} == set(RECORD_KINDS)
    reconfigure = parse_record(RECORDS[7])
    assert isinstance(reconfigure, ReconfigureRecord) and reconfigure.from_ == CandidateConfig.from_dict(CONFIG)
    assert reconfigure.order == SwitchOrder(config=reconfigure.to, **ORDER_REASONS)
    change = reconfigure.reconfiguration()
    assert change.change == "gbs" and change.as_dict()["predicted_gain"] == 0.2
    assert Reconfiguration.from_dict(change.as_dict()) == change
    unordered = parse_record(RECORDS[8])  # a change nobody ordered (a fallback's record carries none)
    assert unordered.order is None and unordered.reconfiguration().fell_back.startswith("ReshardFailed")
    end = parse_record(END)
    assert isinstance(end, EndRecord) and end.payload() == {k: v for k, v in END.items() if k != "kind"}
    assert parse_record(STEP).config().label() == "dp2-tp1-pp1 mbs2 gbs8"


def test_hand_written_records_parse_and_bad_ones_are_refused():
    partial = parse_record({"kind": "step", "step": 2, "train_loss": 2.5})  # as tests write them
    assert isinstance(partial, StepRecord) and partial.samples is None and partial.b_noise is None
    with pytest.raises(RecordError, match="unknown record kind"):
        parse_record({"kind": "weather"})
    with pytest.raises(RecordError, match="checkpoint"):
        parse_record({"kind": "checkpoint", "step": 1})
