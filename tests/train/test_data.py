"""Datasets and the sample-exact loader: determinism, exact resume, GBS changes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from copus.train.data import SampleOrder, TokenWindows, TrainStream, replica_batch, validation_indices
from workloads.corpus import DatasetError, stdlib_source_files
from workloads.datasets import prepare_dataset


def _stdlib(cache):
    return prepare_dataset("stdlib", None, None, "text", "uint16", 0.01, 256, str(cache))


def test_stdlib_corpus_is_deterministic_cached_and_excludes_site_packages(token_cache, tmp_path):
    root, files = stdlib_source_files()
    assert files == sorted(files, key=lambda p: p.relative_to(root).as_posix())
    assert not any("site-packages" in p.parts or "dist-packages" in p.parts for p in files)
    first = _stdlib(token_cache)
    again = _stdlib(token_cache)  # cache hit
    rebuilt = _stdlib(tmp_path / "other-cache")  # independent build
    assert first == again
    assert rebuilt.fingerprint == first.fingerprint
    train = np.memmap(first.train, dtype=first.dtype, mode="r")
    val = np.memmap(first.val, dtype=first.dtype, mode="r")
    assert train.size > 5_000_000 and val.size > 50_000  # tens of MB of real source
    assert int(train.max()) < 256
    assert "standard library" in first.description


def _windows(tmp_path, n_tokens=1001, seq_len=10) -> TokenWindows:
    path = tmp_path / "tok.bin"
    np.arange(n_tokens, dtype=np.uint32).tofile(path)
    return TokenWindows(path, "uint32", seq_len)


def test_windows_are_inputs_and_shifted_targets(tmp_path):
    w = _windows(tmp_path)
    assert w.num_samples == 100
    x, y = w.batch(np.array([0, 3]))
    assert x.shape == (2, 10) and x.dtype.is_floating_point is False
    assert x[1].tolist() == list(range(30, 40)) and y[1].tolist() == list(range(31, 41))


def test_sample_order_is_a_permutation_per_epoch_and_reproducible():
    order = SampleOrder(50, seed=3)
    epoch0, epoch1 = order.indices(0, 50), order.indices(50, 50)
    assert sorted(epoch0) == list(range(50)) and sorted(epoch1) == list(range(50))
    assert not np.array_equal(epoch0, epoch1)
    assert np.array_equal(SampleOrder(50, seed=3).indices(0, 100), np.concatenate([epoch0, epoch1]))
    assert not np.array_equal(SampleOrder(50, seed=4).indices(0, 50), epoch0)


@settings(max_examples=60, deadline=None)
@given(
    gbs_sequence=st.lists(st.sampled_from([4, 8, 12, 16, 32]), min_size=1, max_size=25),
    cut=st.integers(min_value=0, max_value=25),
)
def test_gbs_changes_and_resume_neither_skip_nor_repeat(tmp_path_factory, gbs_sequence, cut):
    w = _windows(tmp_path_factory.mktemp("w"), n_tokens=371, seq_len=10)  # 37 samples: batches cross epochs
    reference = SampleOrder(w.num_samples, seed=1).indices(0, sum(gbs_sequence))
    stream = TrainStream(w, seed=1)
    taken = []
    for i, gbs in enumerate(gbs_sequence):
        if i == cut:  # resume from a saved position in a fresh stream
            saved = json.loads(json.dumps(stream.state_dict()))
            stream = TrainStream(w, seed=1)
            stream.load_state_dict(saved)
        taken.append(stream.next_global_batch(gbs))
    assert np.array_equal(np.concatenate(taken), reference)
    assert stream.samples_consumed == sum(gbs_sequence)


def test_resume_refuses_another_dataset_or_seed(tmp_path):
    w = _windows(tmp_path)
    state = TrainStream(w, seed=1).state_dict()
    with pytest.raises(ValueError, match="data position was saved for"):
        TrainStream(w, seed=2).load_state_dict(state)


@pytest.mark.parametrize("dp,mbs", [(1, 4), (2, 2), (4, 1), (2, 4)])
def test_replica_batches_partition_the_global_batch(dp, mbs):
    global_indices = np.arange(100, 116)
    parts = [replica_batch(global_indices, r, dp, mbs) for r in range(dp)]
    joined = np.concatenate([np.concatenate(p.microbatches) for p in parts])
    assert np.array_equal(joined, global_indices)
    assert all(len(mb) == mbs for p in parts for mb in p.microbatches)
    with pytest.raises(ValueError, match="not divisible"):
        replica_batch(np.arange(10), 0, 4, 1)


def test_validation_set_is_fixed_and_bounded(tmp_path):
    w = _windows(tmp_path)
    assert validation_indices(w, 5).tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="eval.val_samples: 500 exceeds the 100 samples"):
        validation_indices(w, 500)


def test_user_text_jsonl_and_bin_files(tmp_path):
    txt = tmp_path / "a.txt"
    txt.write_text("hello world\n" * 200)
    files = prepare_dataset("txt", str(txt), None, "text", "uint16", 0.1, 256, str(tmp_path / "c"))
    tokens = np.concatenate([np.fromfile(files.train, dtype=files.dtype), np.fromfile(files.val, dtype=files.dtype)])
    assert bytes(tokens.astype(np.uint8)) == txt.read_bytes()

    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text("\n".join(json.dumps({"body": f"doc {i}"}) for i in range(50)) + "\n")
    val = tmp_path / "v.jsonl"
    val.write_text(json.dumps({"body": "held out"}) + "\n")
    files = prepare_dataset("jsonl", str(jsonl), str(val), "body", "uint16", 0.1, 256, str(tmp_path / "c"))
    assert bytes(np.fromfile(files.train, dtype=files.dtype).astype(np.uint8)).split(b"\x00")[:2] == [
        b"doc 0",
        b"doc 1",
    ]
    assert bytes(np.fromfile(files.val, dtype=files.dtype).astype(np.uint8)) == b"held out"

    binf = tmp_path / "a.bin"
    np.arange(1000, dtype=np.uint32).tofile(binf)
    files = prepare_dataset("bin", str(binf), None, "text", "uint32", 0.1, 1000, str(tmp_path / "c"))
    assert np.fromfile(files.train, dtype="uint32").tolist() == list(range(900))


def test_bad_user_files_are_named(tmp_path):
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text('{"text": "ok"}\n{"other": 1}\n')
    with pytest.raises(DatasetError, match=r"bad\.jsonl:2: no string field 'text'"):
        prepare_dataset("jsonl", str(jsonl), None, "text", "uint16", 0.1, 256, str(tmp_path / "c"))
    jsonl.write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(DatasetError, match=r"bad\.jsonl:2: not valid JSON"):
        prepare_dataset("jsonl", str(jsonl), None, "text", "uint16", 0.1, 256, str(tmp_path / "c"))
    binf = tmp_path / "big.bin"
    np.array([1, 2, 70000], dtype=np.uint32).tofile(binf)
    with pytest.raises(DatasetError, match=r"big\.bin: token id 70000 is outside the model's vocabulary of 256"):
        prepare_dataset("bin", str(binf), None, "text", "uint32", 0.1, 256, str(tmp_path / "c"))
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x02\x03")
    with pytest.raises(DatasetError, match=r"odd\.bin: size 3 is not a multiple of 2 bytes"):
        prepare_dataset("bin", str(odd), None, "text", "uint16", 0.1, 256, str(tmp_path / "c"))
