"""copus.storage: one filesystem layer for a local path and for an object store (moto's S3 server
on loopback), with the same answers from both; what COPUS builds on it (profile tables, the
records log, checkpoints chosen and downloaded from a bucket)."""

from __future__ import annotations

import contextlib
import json
import pickle

import pytest

from copus.cluster.profile_table import ProfileTable
from copus.config import ConfigError, config_from_mapping
from copus.storage import AppendLog, Location, StorageError, check_location, local_copy, read_lines, staged_directory
from copus.train.checkpoint import COMPLETE, checkpoint_dirs, newest_complete
from tests.s3_server import bucket_uri, s3_server
from workloads.corpus import file_digest


@pytest.fixture(scope="module")
def s3_endpoint():
    with s3_server() as endpoint:
        yield endpoint


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path) -> Location:
    """A fresh directory on each filesystem."""
    if request.param == "local":
        return Location.parse(tmp_path / "root")
    return Location.parse(bucket_uri(request.getfixturevalue("s3_endpoint"), tmp_path.name))


def test_files_are_written_read_listed_and_removed_the_same_way_everywhere(root):
    assert not root.exists() and root.iterdir() == []
    (root / "b.json").write_json({"x": 1})
    (root / "a" / "c.txt").write_text("c")
    assert (root / "b.json").read_json() == {"x": 1} and (root / "a" / "c.txt").read_text() == "c"
    assert [c.name for c in root.iterdir()] == ["a", "b.json"]  # nothing else: no temporary file is left
    assert (
        root.is_dir()
        and (root / "a").is_dir()
        and (root / "b.json").is_file()
        and (root / "b.json").size() == len(b'{\n  "x": 1\n}')
    )
    with pytest.raises(FileNotFoundError, match="nope.json"):
        (root / "nope.json").read_text()
    (root / "b.json").write_json({"x": 2})  # replaced whole
    assert (root / "b.json").read_json() == {"x": 2}
    (root / "b.json").unlink()
    (root / "b.json").unlink(missing_ok=True)
    (root / "a").rmtree()
    assert not (root / "a").exists() and not (root / "b.json").exists()
    assert pickle.loads(pickle.dumps(root / "x")) == root / "x"  # goes to Ray workers and actors as it is


def test_a_location_prints_as_what_the_user_passes_again(s3_endpoint, tmp_path):
    uri = bucket_uri(s3_endpoint, "runs/exp1")
    where = Location.parse(uri)
    assert str(where) == uri and not where.is_local and where.path == "runs/runs/exp1"
    assert str(where / "summary.json") == uri.replace("exp1?", "exp1/summary.json?")
    assert Location.parse(str(where / "a")) == where / "a" and (where / "a").parent == where
    local = Location.parse(tmp_path / "x" / ".." / "y")
    assert str(local) == str(tmp_path / "y") and local == tmp_path / "y" and local.is_local
    with pytest.raises(StorageError, match="object-store location"):
        open(where / "summary.json")


@pytest.mark.parametrize(
    "value, problem", [("ftp://host/x", "unknown scheme 'ftp'"), ("s3://", "names no bucket or path")]
)
def test_a_bad_output_location_is_one_line_naming_the_field(base_mapping, value, problem):
    with pytest.raises(StorageError, match=problem):
        check_location(value)
    with pytest.raises(ConfigError, match=f"output_dir.*{problem}") as err:
        config_from_mapping({**base_mapping, "output_dir": value})
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="profile.table_dir"):
        config_from_mapping({**base_mapping, "profile": {"table_dir": value}})


def test_the_records_log_appends_across_drivers_and_reaches_the_bucket_on_flush_and_close(root):
    log = AppendLog(root / "records.jsonl", upload_every_s=3600.0)
    log.write("1\n")
    log.flush()
    # Locally every flush is on disk; on the bucket the upload waits for its interval.
    assert list(read_lines(root / "records.jsonl")) == (["1\n"] if root.is_local else [])
    log.flush(force=True)
    assert list(read_lines(root / "records.jsonl")) == ["1\n"]
    log.write("2\n")
    log.close()
    again = AppendLog(root / "records.jsonl")  # a resumed run's driver appends to what is there
    again.write("3\n")
    again.close()
    assert list(read_lines(root / "records.jsonl")) == ["1\n", "2\n", "3\n"]
    # A driver that died mid-line: the next driver's first record starts a line of its own.
    cut = AppendLog(root / "records.jsonl")
    cut.write('{"kind": "st')
    cut.close()
    after = AppendLog(root / "records.jsonl")
    after.write("4\n")
    after.close()
    assert list(read_lines(root / "records.jsonl"))[-2:] == ['{"kind": "st\n', "4\n"]


def test_directories_go_to_and_come_from_a_location_whole(root, tmp_path):
    with staged_directory(root / "tree") as local:
        (local / "sub").mkdir()
        (local / "sub" / "f.bin").write_bytes(b"\x00\x01")
        (local / "g.txt").write_text("g")
    with local_copy(root / "tree") as copy:
        assert sorted(str(p.relative_to(copy)) for p in copy.rglob("*")) == ["g.txt", "sub", "sub/f.bin"]
        assert (copy / "sub" / "f.bin").read_bytes() == b"\x00\x01"
    assert copy.exists() == root.is_local  # a download is removed on exit, a local directory kept
    with pytest.raises(RuntimeError), staged_directory(root / "failed") as local:
        (local / "half").write_text("x")
        raise RuntimeError("the writer failed")
    # Locally the files are written in place; to a bucket nothing is uploaded after an error.
    assert (root / "failed" / "half").exists() == root.is_local


def test_profile_tables_are_saved_and_opened_at_any_location(root):
    key = {"workload": "w", "hardware": "h", "world": 2}
    table = ProfileTable.open(root / "profiles", key)
    table.rows.append({"dp": 2, "tp": 1, "pp": 1, "mbs": 2, "gbs": 8, "status": "ok", "step_time_s": 0.1})
    path = table.save(root / "profiles")
    assert path.is_file() and ProfileTable.open(root / "profiles", key).rows == table.rows


def _fake_checkpoint(where: Location, step: int, complete: bool) -> None:
    """A checkpoint's files as save_checkpoint lays them out: data, manifest, COMPLETE."""
    data = f"weights of step {step}".encode()
    (where / "__0_0.distcp").write_bytes(data)
    with local_copy(where) as local:
        digest = file_digest(local / "__0_0.distcp")
    manifest = {"rank": 0, "world_size": 1, "files": {"__0_0.distcp": {"size": len(data), "sha256": digest}}}
    (where / "manifest_rank0.json").write_text(json.dumps(manifest))
    if complete:
        (where / COMPLETE).write_json({"step": step, "world_size": 1})


def test_a_torn_checkpoint_in_storage_is_refused_and_the_one_before_it_used(root):
    ray_root = root / "ray" / "train"
    _fake_checkpoint(ray_root / "checkpoint_2026-11-30_10-00-00.000001", 4, complete=True)
    _fake_checkpoint(ray_root / "checkpoint_2026-11-30_10-05-00.000001", 8, complete=False)
    (ray_root / "not_a_checkpoint.json").write_json({})
    candidates = checkpoint_dirs(ray_root)
    assert [c.name[-15:] for c in candidates] == ["10-05-00.000001", "10-00-00.000001"]
    with contextlib.ExitStack() as stack:
        chosen, refused = newest_complete(candidates, stack)
        assert (chosen / "__0_0.distcp").read_bytes() == b"weights of step 4"
        assert refused == [(candidates[0], f"not marked {COMPLETE} (a write that did not finish)")]


def test_a_suite_in_a_bucket_gives_each_run_its_folder_and_the_shared_profiles_there(base_mapping):
    from copus.cluster.compare import _policy_config, suite_table_dir
    from copus.config import SuiteConfig

    uri = bucket_uri("127.0.0.1:9", "suites/s1")  # nothing is opened: no server needed
    suite = SuiteConfig.model_validate({"experiment": base_mapping, "output_dir": uri})
    base = config_from_mapping(base_mapping)
    table_dir = suite_table_dir(suite, base)
    cfg = _policy_config(suite, base_mapping, [], "copus", 1, 7, Location.parse(uri) / "copus" / "r1", table_dir)
    assert cfg.resolved_output_dir() == Location.parse(uri) / "copus" / "r1"
    assert cfg.resolved_profile_dir() == Location.parse(uri) / "profiles"
    assert str(cfg.resolved_output_dir()).endswith(
        "s1/copus/r1?endpoint_override=127.0.0.1:9&scheme=http&region=us-east-1"
    )
