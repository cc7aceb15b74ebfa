"""Ray Train end to end: a 2-worker run trains, checkpoints, is relaunched and resumes at the
same step with the same next loss as an uninterrupted run; MLflow holds what it should."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import mlflow
import pytest
import ray
from mlflow.tracking import MlflowClient
from ray.train.v2._internal.callbacks.datasets import DatasetsCallback

from copus.cluster.driver import run_experiment
from copus.cluster.entry import TrainLaunch, train_worker
from copus.cluster.gns_command import measure_experiment_gns
from copus.cluster.launch import one_shot_trainer, prepare_plan
from copus.cluster.loop_config import opened
from copus.config import config_from_mapping
from tests.conftest import empty_mlflow_db, experiment_mapping

pytestmark = pytest.mark.slow


def _history(client: MlflowClient, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


@pytest.fixture(scope="module")
def relaunched(token_cache, tmp_path_factory) -> dict:
    """A 6-step run, and the same run cut at step 3 and relaunched. The cut's first launch (3
    steps, dp = 2) is also the reference of the 3D test: one Ray run fewer."""
    tmp = tmp_path_factory.mktemp("relaunch")
    mapping = experiment_mapping(tmp, token_cache)
    empty_mlflow_db(tmp / "mlflow.db")
    messages: list[str] = []
    whole_cfg = config_from_mapping(mapping, [f"output_dir={tmp / 'whole'}", "tracking.run_name=whole"])
    whole = run_experiment(whole_cfg, echo=messages.append)
    cut_dir = tmp / "cut"
    first = run_experiment(
        config_from_mapping(mapping, [f"output_dir={cut_dir}", "stop.max_steps=3"]), echo=messages.append
    )
    client = MlflowClient(tracking_uri=whole_cfg.resolved_tracking_uri())
    first_loss = _history(client, first["mlflow_run_id"], "train_loss")  # before the relaunch adds to the run
    resumed = run_experiment(config_from_mapping(mapping, [f"output_dir={cut_dir}"]), echo=messages.append)
    return {
        "tmp": tmp,
        "mapping": mapping,
        "client": client,
        "messages": messages,
        "whole": whole,
        "first": first,
        "first_loss": first_loss,
        "resumed": resumed,
        "cut_dir": cut_dir,
    }


def test_relaunch_resumes_with_the_same_next_loss(relaunched):
    whole, first, resumed, cut_dir = (relaunched[k] for k in ("whole", "first", "resumed", "cut_dir"))
    assert first["steps"] == 3 and first["stop_reason"] == "max_steps"
    assert any(m.startswith(f"resuming run in {cut_dir}") for m in relaunched["messages"])

    # Same MLflow run across the relaunch, and the same numbers as the uninterrupted run.
    assert resumed["mlflow_run_id"] == first["mlflow_run_id"] != whole["mlflow_run_id"]
    assert resumed["launches"] == 2 and resumed["steps"] == whole["steps"] == 6
    assert resumed["samples"] == whole["samples"] == 48
    client = relaunched["client"]
    whole_loss = _history(client, whole["mlflow_run_id"], "train_loss")
    cut_loss = _history(client, resumed["mlflow_run_id"], "train_loss")
    assert sorted(cut_loss) == sorted(whole_loss) == [1, 2, 3, 4, 5, 6]
    for step in whole_loss:
        assert cut_loss[step] == pytest.approx(whole_loss[step], rel=1e-5), step
    assert resumed["final_val_loss"] == pytest.approx(whole["final_val_loss"], rel=1e-5)

    summary = json.loads((cut_dir / "summary.json").read_text())
    for key in (
        "policy",
        "reached_target",
        "time_to_target_s",
        "final_val_loss",
        "steps",
        "samples",
        "wall_clock_s",
        "mlflow_run_id",
        "reconfigurations",
    ):
        assert key in summary
    assert summary["reconfigurations"] == [] and summary["reached_target"] is False
    assert summary["time_to_target_s"] is None


def test_mlflow_run_content_and_time_to_target(base_mapping, tmp_path, monkeypatch):
    # A target the debug model reaches within a few steps: time_to_target_s must be logged.
    # Step 2's gradient is made NaN on the workers: the step is skipped, counted and logged.
    monkeypatch.setenv("COPUS_INJECT_NONFINITE_STEPS", "2")
    cfg = config_from_mapping(
        base_mapping, ["stop.target_val_loss=5.0", "stop.max_steps=30", "tracking.run_name=target"]
    )
    messages: list[str] = []
    summary = run_experiment(cfg, echo=messages.append)
    assert summary["reached_target"] and summary["stop_reason"] == "target_val_loss"
    assert summary["nonfinite_steps"] == 1 and summary["skipped_samples"] == 8
    assert any(m.startswith("warning: step 2: non-finite loss") and "update skipped" in m for m in messages)
    assert [
        m.step
        for m in MlflowClient(tracking_uri=cfg.resolved_tracking_uri()).get_metric_history(
            summary["mlflow_run_id"], "nonfinite_steps"
        )
    ] == [2]
    assert 0 < summary["time_to_target_s"] <= summary["wall_clock_s"]

    mlflow.set_tracking_uri(cfg.resolved_tracking_uri())
    runs = mlflow.search_runs(experiment_names=["tests"], filter_string="tags.policy = 'static'")
    row = runs[runs["run_id"] == summary["mlflow_run_id"]].iloc[0]
    assert row["status"] == "FINISHED"
    assert (
        row["params.batch.gbs"] == "8" and row["params.parallel.dp"] == "2" and row["params.workload.model"] == "debug"
    )
    assert row["tags.layout"] == "dp2-tp1-pp1" and row["tags.reached_target"] == "True"
    assert row["metrics.time_to_target_s"] == pytest.approx(summary["time_to_target_s"])
    client = MlflowClient(tracking_uri=cfg.resolved_tracking_uri())
    for key in (
        "train_loss",
        "val_loss",
        "samples_per_s",
        "tokens_per_s",
        "step_time_s",
        "gbs",
        "mbs",
        "lr",
        "samples",
        "wall_clock_s",
        "gns_sqr",
        "gns_var",
        "b_noise",
        "critical_batch_size",
        "statistical_efficiency",
    ):
        assert client.get_metric_history(summary["mlflow_run_id"], key), key
    steps = _history(client, summary["mlflow_run_id"], "train_loss")
    assert sorted(steps) == [s for s in range(1, summary["steps"] + 1) if s != 2]  # step 2 made no update


def test_3d_layout_on_eight_ray_workers_matches_data_parallel(relaunched):
    """dp=2 x tp=2 x pp=2 on 8 Ray workers trains the same numbers as dp=2 alone (the first
    launch of the relaunch test: 3 steps, an eval at step 3, in the same MLflow database)."""
    flat = relaunched["first"]
    cfg3d = config_from_mapping(
        relaunched["mapping"],
        [
            "stop.max_steps=3",
            "eval.every_steps=3",
            f"output_dir={relaunched['tmp'] / '3d'}",
            "parallel.tp=2",
            "parallel.pp=2",
            "cluster.num_workers=8",
        ],
    )
    three_d = run_experiment(cfg3d, echo=lambda _: None)
    client = MlflowClient(tracking_uri=cfg3d.resolved_tracking_uri())
    flat_loss = relaunched["first_loss"]
    loss_3d = _history(client, three_d["mlflow_run_id"], "train_loss")
    assert sorted(loss_3d) == sorted(flat_loss) == [1, 2, 3]
    for step, value in flat_loss.items():
        assert loss_3d[step] == pytest.approx(value, rel=1e-4), step
    assert three_d["final_val_loss"] == pytest.approx(flat["final_val_loss"], rel=1e-4)
    assert three_d["layout"] == {"dp": 2, "tp": 2, "pp": 2, "mbs": 2, "gbs": 8, "dp_shard": "none", "recompute": "none"}
    run = client.get_run(three_d["mlflow_run_id"])
    assert run.data.tags["layout"] == "dp2-tp2-pp2"
    assert run.data.metrics["pp"] == 2 and run.data.metrics["tp"] == 2
    # The step-time breakdown is logged with the layout.
    for key in (
        "forward_backward_time_s",
        "dp_allreduce_time_s",
        "grad_norm_time_s",
        "optimizer_time_s",
        "pipeline_bubble_fraction",
    ):
        assert client.get_metric_history(three_d["mlflow_run_id"], key), key
    assert run.data.metrics["pipeline_bubble_fraction"] == pytest.approx(1 / 3)  # (p-1)/(m+p-1), m = 2


def test_gns_command_measures_on_the_ray_workers(base_mapping):
    cfg = config_from_mapping(base_mapping)
    result = measure_experiment_gns(cfg, steps=5)
    assert result["steps"] == 5 and result["reference_gbs"] == 8 and result["skipped_nonfinite"] == 0
    for key in ("b_noise", "grad_sqr", "grad_var", "critical_batch_size"):
        assert isinstance(result[key], float)
    assert result["critical_batch_size"] == pytest.approx(cfg.gns.critical_factor * result["b_noise"])
    assert result["b_noise_low"] <= result["b_noise_high"]  # a bootstrap interval over the 5 batches


def test_relaunch_with_another_workload_is_refused_before_anything_starts(relaunched, tmp_path):
    from copus.config import ConfigError

    # A copy of the fixture's finished run (a run of its own would be one Ray run more).
    held = tmp_path / "held"
    shutil.copytree(relaunched["tmp"] / "whole", held)
    changed = config_from_mapping(
        relaunched["mapping"], [f"output_dir={held}", "stop.max_steps=2", "workload.seq_len=64"]
    )
    with pytest.raises(ConfigError, match=r"^output_dir: .* holds a run this configuration cannot resume"):
        run_experiment(changed, echo=lambda _: None)
    # --fresh starts over in the same directory.
    assert run_experiment(changed, fresh=True, echo=lambda _: None)["steps"] == 2


def test_what_ray_trains_controller_unpickles_imports_neither_torch_nor_the_training_stack(base_mapping, tmp_path):
    """Ray Train hands its controller actor the run context (train_loop_config in it) and the
    callbacks (the backend config in them), and the actor unpickles them: a launch in there
    imported copus's training stack and torch.distributed's checkpoint, DTensor and pipelining
    modules, and Ray's TorchConfig imported torch, in a process that never trains (~2.7 and ~2.3
    CPU-s of each run on 2 cores, the second on the critical path of every launch). Unpickled
    here as the controller does, in a fresh process joined to the tests' Ray instance."""
    cfg = config_from_mapping(base_mapping)
    _, plan = prepare_plan(cfg)
    launch = TrainLaunch(plan=plan, monitor=None, clock_origin=0.0, adaptive=False)
    with one_shot_trainer(cfg, train_worker, launch.as_loop_config(), "pickle-check") as trainer:
        callbacks = trainer._create_default_callbacks()
        (tmp_path / "controller.pkl").write_bytes(ray.cloudpickle.dumps((trainer.train_run_context, callbacks)))
        imported = json.loads(_unpickled_in_a_fresh_process(tmp_path / "controller.pkl"))
        assert imported == ["copus", "copus.cluster", "copus.cluster.torch_backend"]  # and no torch module
        assert opened(trainer.train_run_context.train_loop_config)["launch"] == launch  # what a worker opens
    # and no Ray Data DatasetManager actor (a process importing Ray Data) for a run without a Ray Dataset
    assert not any(isinstance(c, DatasetsCallback) for c in callbacks)


def _unpickled_in_a_fresh_process(payload) -> str:
    """The torch and copus modules a new process joined to this Ray instance imports to unpickle
    `payload` (its object references need a connected worker), as a JSON list."""
    code = (
        "import json, sys, ray, ray.cloudpickle; ray.init(address=sys.argv[2], log_to_driver=False); "
        "ray.cloudpickle.loads(open(sys.argv[1], 'rb').read()); "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'copus'))))"
    )
    address = ray.get_runtime_context().gcs_address
    done = subprocess.run(
        [sys.executable, "-c", code, str(payload), address], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]
