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


def _healthy_cluster(monkeypatch, link_mbit: float) -> list[float]:
    """An emulated cluster that is up at `link_mbit`, as emulate.status reads it; returns the
    rates emulate.reshape is asked for (recorded, and the state follows them as the real one)."""
    from copus.cluster import emulate

    state = {"healthy": True, "spec": {"link_mbit": link_mbit}}
    asked: list[float] = []

    def reshape(state_dir, mbit):
        asked.append(mbit)
        state["spec"]["link_mbit"] = mbit

    monkeypatch.setattr(emulate, "status", lambda state_dir: state)
    monkeypatch.setattr(emulate, "reshape", reshape)
    return asked


def test_every_run_measures_again_and_recaps_the_links_of_the_cluster_that_is_up(base_mapping, monkeypatch, tmp_path):
    monkeypatch.setenv("COPUS_CACHE_DIR", str(tmp_path / "cache"))
    readings = iter([0.1, 0.05, 0.05, 0.2])
    monkeypatch.setattr(reference_step, "reference_step_s", lambda *a: next(readings))
    cfg = _config(base_mapping, compute_reference_s=0.1, compute_reference_every="run")
    assert EmulatedSpec.from_config(cfg).link_mbit == 200.0  # brought up at the first reading
    asked = _healthy_cluster(monkeypatch, 200.0)
    lines: list[str] = []
    # The machine got twice as fast: the next run measures it and doubles the rate.
    assert emulate_link.relink(cfg, lines.append).link_mbit == 400.0
    assert asked == [400.0] and lines[-1].startswith("links: 400 Mbit/s (was 200): the reference step read 0.0500 s")
    assert emulate_link.link_rate(cfg).link_mbit == 400.0  # the run's topology reads the rate it runs at
    assert emulate_link.relink(cfg, lines.append).link_mbit == 400.0 and asked == [400.0]  # unchanged: not re-capped
    # A new process (the next `copus run` against this cluster) describes it as it now is.
    monkeypatch.setattr(emulate_link, "_MEASURED", {})
    assert EmulatedSpec.from_config(cfg).link_mbit == 400.0
    assert emulate_link.relink(cfg, lines.append).link_mbit == 100.0 and asked == [400.0, 100.0]


def test_once_per_machine_or_without_a_cluster_up_nothing_is_remeasured(base_mapping, monkeypatch, tmp_path):
    from copus.cluster import emulate

    monkeypatch.setenv("COPUS_CACHE_DIR", str(tmp_path / "cache"))
    readings = iter([0.05])
    monkeypatch.setattr(reference_step, "reference_step_s", lambda *a: next(readings))
    asked = _healthy_cluster(monkeypatch, 400.0)
    machine = _config(base_mapping, compute_reference_s=0.1)
    assert emulate_link.relink(machine, pytest.fail) is None and asked == []
    assert emulate_link.link_rate(machine).link_mbit == 400.0  # the one reading
    monkeypatch.setattr(emulate, "status", lambda state_dir: None)
    every_run = _config(base_mapping, compute_reference_s=0.1, compute_reference_every="run")
    assert emulate_link.relink(every_run, pytest.fail) is None and asked == []
    assert emulate_link.relink(_config(base_mapping), pytest.fail) is None


def test_a_profile_over_links_recapped_every_run_is_keyed_by_the_ratio_not_the_rate(
    base_mapping, monkeypatch, tmp_path
):
    monkeypatch.setenv("COPUS_CACHE_DIR", str(tmp_path / "cache"))
    readings = iter([0.05, 0.2])
    monkeypatch.setattr(reference_step, "reference_step_s", lambda *a: next(readings))
    machine = _config(base_mapping, compute_reference_s=0.1)
    assert emulate_link.link_key(machine) == {"link_mbit": 400.0}
    every_run = _config(base_mapping, compute_reference_s=0.1, compute_reference_every="run")
    key = {"link_mbit_at_reference": 200.0, "compute_reference_s": 0.1}
    assert emulate_link.link_key(every_run) == key
    _healthy_cluster(monkeypatch, 400.0)
    emulate_link.relink(every_run, lambda line: None)  # the rate moves to 100 Mbit/s ...
    assert emulate_link.link_key(every_run) == key  # ... the table's key does not


def test_the_hardware_label_names_the_link_either_way():
    from copus.train.host import hardware_label

    cpu = {"kind": "cpu", "cpu": "Xeon", "cores": 1, "host_memory_gib": 12}
    fixed = hardware_label({**cpu, "emulated": {"nodes": 2, "link_mbit": 380.0, "cores_per_node": 1}})
    assert fixed.endswith("EMULATED 2-node cluster (links 380 Mbit/s)")
    ratio = {"nodes": 2, "link_mbit_at_reference": 380.0, "compute_reference_s": 0.1053, "cores_per_node": 1}
    assert "links 380 Mbit/s at a 0.1053 s reference step, re-capped" in hardware_label({**cpu, "emulated": ratio})
