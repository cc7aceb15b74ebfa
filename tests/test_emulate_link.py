"""The emulated cluster's link rate scaled to this machine's compute (copus.cluster.emulate_link):
the rate that keeps the all-reduce/compute ratio, measured once per machine and workload, read
by the cluster's spec and by the run's topology. No root needed: nothing here brings a cluster up."""

from __future__ import annotations

import math

import pytest
import yaml

from copus.cli import main as cli_main
from copus.cluster import emulate_link
from copus.cluster.emulate import EmulatedSpec
from copus.config import ConfigError, config_from_mapping
from copus.train import reference_step


@pytest.fixture(autouse=True)
def _fresh_process_cache(monkeypatch):
    """Each test starts as a new process would: nothing measured in it yet."""
    monkeypatch.setattr(emulate_link, "_MEASURED", {})


def _config(base_mapping: dict, **emulated):
    mapping = {**base_mapping, "cluster": {"num_workers": 2, "emulate": {"nodes": 2, "link_mbit": 200.0, **emulated}}}
    return config_from_mapping(mapping)


def test_a_machine_twice_as_fast_gets_twice_the_rate():
    assert emulate_link.scaled_link_mbit(200.0, reference_step_s=0.2, measured_step_s=0.1) == 400.0
    assert emulate_link.scaled_link_mbit(200.0, reference_step_s=0.1, measured_step_s=0.3) == pytest.approx(66.7)


def test_without_a_reference_the_configured_rate_is_kept_and_nothing_is_measured(base_mapping, monkeypatch):
    def measure(*args):
        raise AssertionError("measured without compute_reference_s")

    monkeypatch.setattr(reference_step, "reference_step_s", measure)
    rate = emulate_link.link_rate(_config(base_mapping))
    assert rate == emulate_link.LinkRate(200.0, 200.0, None, None)
    assert EmulatedSpec.from_config(_config(base_mapping)).link_mbit == 200.0


def test_the_reference_step_is_measured_once_per_machine_and_scales_the_spec(base_mapping, monkeypatch, tmp_path):
    monkeypatch.setenv("COPUS_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def measure(flavour, seq_len, samples):
        calls.append((flavour.name, seq_len, samples))
        return 0.05

    monkeypatch.setattr(reference_step, "reference_step_s", measure)
    cfg = _config(base_mapping, compute_reference_s=0.1)
    first = emulate_link.link_rate(cfg)
    # One rank's share of dp2 at the reference GBS 8, in one micro-batch of the workload's shape.
    assert calls == [("debug", 32, 4)]
    assert first == emulate_link.LinkRate(400.0, 200.0, 0.1, 0.05)
    assert EmulatedSpec.from_config(cfg).link_mbit == 400.0 and len(calls) == 1  # read from the cache
    assert first.as_dict()["configured_mbit"] == 200.0
    # Another workload shape is another measurement.
    emulate_link.link_rate(
        _config({**base_mapping, "workload": {**base_mapping["workload"], "seq_len": 16}}, compute_reference_s=0.1)
    )
    assert calls[-1] == ("debug", 16, 4) and len(calls) == 2


def test_a_damaged_cache_file_is_measured_again(base_mapping, monkeypatch, tmp_path):
    monkeypatch.setenv("COPUS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(reference_step, "reference_step_s", lambda *a: 0.2)
    cfg = _config(base_mapping, compute_reference_s=0.1)
    emulate_link.link_rate(cfg)
    (cached,) = (tmp_path / "cache" / "reference-step").glob("*.json")
    cached.write_text("{not json")
    monkeypatch.setattr(reference_step, "reference_step_s", lambda *a: 0.1)
    assert emulate_link.link_rate(cfg).link_mbit == 100.0  # this process keeps what it measured
    monkeypatch.setattr(emulate_link, "_MEASURED", {})  # a new process reads the damaged file
    assert emulate_link.link_rate(cfg).link_mbit == 200.0


def test_an_unwritable_cache_still_gives_one_rate_per_process(base_mapping, monkeypatch, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("COPUS_CACHE_DIR", str(blocker))
    readings = iter([0.05, 0.2])
    monkeypatch.setattr(reference_step, "reference_step_s", lambda *a: next(readings))
    cfg = _config(base_mapping, compute_reference_s=0.1)
    assert emulate_link.link_rate(cfg).link_mbit == 400.0
    assert EmulatedSpec.from_config(cfg).link_mbit == 400.0  # not measured again: 0.2 unread


def test_the_real_reference_step_is_a_few_milliseconds_of_training(base_mapping, tmp_path, capsys):
    cfg = _config(base_mapping, compute_reference_s=0.1)
    flavour, seq_len, samples = emulate_link.reference_shape(cfg)
    seconds = reference_step.reference_step_s(flavour, seq_len, samples, steps=3)
    assert math.isfinite(seconds) and 0.0 < seconds < 5.0
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({**base_mapping, "cluster": {"num_workers": 2}}))
    assert reference_step.main([str(path)]) == 0
    assert float(capsys.readouterr().out.strip()) > 0.0


def test_a_bad_reference_is_refused_naming_the_field(base_mapping, tmp_path, capsys):
    with pytest.raises(ConfigError, match="cluster.emulate.compute_reference_s"):
        _config(base_mapping, compute_reference_s=0)
    path = tmp_path / "exp.yaml"
    path.write_text(
        yaml.safe_dump(
            {**base_mapping, "cluster": {"num_workers": 2, "emulate": {"link_mbit": 100, "compute_reference_s": -1}}}
        )
    )
    assert cli_main(["validate", str(path)]) == 2
    assert "cluster.emulate.compute_reference_s" in capsys.readouterr().err
