"""MLflow: experiments open in model-training mode; a run is named by what sets it apart."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from copus.cluster.driver import run_label
from copus.config import config_from_mapping
from copus.core.throughput import Config
from copus.tracking import EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND, Tracker


def test_experiments_are_tagged_as_model_training(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri, "kind-test")
    tags = MlflowClient(tracking_uri=uri).get_experiment(tracker.experiment_id).tags
    assert tags[EXPERIMENT_KIND_TAG] == MODEL_TRAINING_KIND
    assert Tracker(uri, "kind-test").experiment_id == tracker.experiment_id  # found again, tag kept


def test_a_run_is_named_by_policy_gbs_and_layout(base_mapping):
    cfg = config_from_mapping(base_mapping, ["policy.name=static"])
    assert run_label(cfg, Config(2, 1, 1, 2, 8)) == "test static gbs8 dp2-tp1-pp1 mbs2"
