"""Every experiment and comparison suite in experiments/ loads as `copus validate` reads it: the
files the README and `make run` name must not rot when the config grows a field."""

from pathlib import Path

import pytest

from copus.config import ConfigError, config_from_mapping, is_suite_file, load_config, load_suite

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
FILES = sorted([*EXPERIMENTS.glob("*.yaml"), *EXPERIMENTS.glob("gpu/*.yaml")])


def test_there_are_experiment_files_and_make_run_names_one():
    names = {p.name for p in FILES}
    makefile = (EXPERIMENTS.parent / "Makefile").read_text()
    assert "quickstart_compare.yaml" in names and "experiments/quickstart_compare.yaml" in makefile


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(EXPERIMENTS)))
def test_each_experiment_file_validates(path):
    if is_suite_file(path):
        suite, experiment = load_suite(path, [])
        cfg = config_from_mapping(experiment, suite.set)
        assert suite.policies and cfg.stop.target_val_loss is not None
    elif path.name == "finetune_cpu.yaml":  # starts from the export docs/huggingface.md makes first
        try:
            load_config(path)
        except ConfigError as err:
            assert str(err).startswith("workload.init_from: ")
    else:
        cfg = load_config(path)
        assert cfg.name
