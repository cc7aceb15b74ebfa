"""`copus prepare`: a corpus (jsonl, txt, parquet) through a BPE tokenizer trained here on stdlib
docstrings: the tokens are the tokenizer's own with end-of-text separators, processes in
parallel give the same files as one, an interrupted run resumes where it stopped, and the
command prints its figures."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

import workloads.prepare as prepare
from copus.cli import main
from tests.workloads.hf_helpers import make_hf_model, stdlib_docstrings, train_tokenizer, write_jsonl
from workloads.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("prepare")
    docs = stdlib_docstrings(120)
    return {
        "docs": docs,
        "jsonl": write_jsonl(root / "docs.jsonl", docs),
        "tokenizer": train_tokenizer(root / "tokenizer.json", vocab_size=400),
    }


def _build(corpus: dict, cache, kind: str = "jsonl", path=None, workers: int = 1, val_fraction: float = 0.1):
    return prepare.build_tokenized(
        kind, str(path or corpus["jsonl"]), None, "text", str(corpus["tokenizer"]), 512, val_fraction, cache, workers
    )


def _tokens(files) -> np.ndarray:
    return np.concatenate([np.fromfile(files.train, dtype=files.dtype), np.fromfile(files.val, dtype=files.dtype)])


def test_jsonl_tokens_are_the_tokenizers_with_separators(corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(prepare, "UNIT_BYTES", 4096)  # several units, cut at line breaks
    report = _build(corpus, tmp_path)
    tok = load_tokenizer(corpus["tokenizer"])
    eot = tok.token_to_id("<|endoftext|>")
    expected = np.concatenate([np.array(tok.encode(d, add_special_tokens=False).ids + [eot]) for d in corpus["docs"]])
    assert np.array_equal(_tokens(report.files), expected)
    assert report.files.dtype == "uint16" and report.tokens == expected.size
    val = np.fromfile(report.files.val, dtype="uint16")
    assert val.size == int(expected.size * 0.1)  # the tail held out


def test_parallel_equals_serial_and_an_interrupted_run_resumes(corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(prepare, "UNIT_BYTES", 4096)
    parallel = _build(corpus, tmp_path / "a", workers=2)
    assert parallel.workers == 2

    calls = []
    original = prepare.tokenize_unit

    def stop_after_three(unit):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(unit)
        return original(unit)

    monkeypatch.setattr(prepare, "tokenize_unit", stop_after_three)
    with pytest.raises(KeyboardInterrupt):
        _build(corpus, tmp_path / "b")
    monkeypatch.setattr(prepare, "tokenize_unit", original)
    resumed = _build(corpus, tmp_path / "b")
    assert resumed.resumed_units == 3
    assert resumed.files.fingerprint == parallel.files.fingerprint
    assert not (resumed.files.train.parent / "shards").exists()
    assert _build(corpus, tmp_path / "b").tokens == 0  # a third call finds the files


def test_txt_and_parquet(corpus, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    text = "\n".join(corpus["docs"])
    (tmp_path / "a.txt").write_text(text)
    pq.write_table(pa.table({"text": corpus["docs"]}), tmp_path / "docs.parquet", row_group_size=40)
    tok = load_tokenizer(corpus["tokenizer"])
    txt = _tokens(_build(corpus, tmp_path / "c1", "txt", tmp_path / "a.txt").files)
    assert tok.decode(txt[:-1].tolist()) == text and txt[-1] == tok.token_to_id("<|endoftext|>")
    parquet = _build(corpus, tmp_path / "c2", "parquet", tmp_path).files  # a directory of parquet files
    jsonl = _build(corpus, tmp_path / "c3").files
    assert parquet.fingerprint == jsonl.fingerprint  # the same documents, the same tokens


def test_prepare_command(corpus, base_mapping, tmp_path, capsys):
    model = make_hf_model(tmp_path / "model", "llama")  # vocabulary 512: the tokenizer's 400 fit
    mapping = {
        **base_mapping,
        "workload": {
            "init_from": str(model),
            "seq_len": 32,
            "tokenizer": str(corpus["tokenizer"]),
            "dataset": {"kind": "jsonl", "path": str(corpus["jsonl"]), "cache_dir": str(tmp_path / "cache")},
        },
    }
    experiment = tmp_path / "experiment.yaml"
    experiment.write_text(yaml.safe_dump(mapping))
    assert main(["prepare", str(experiment), "--json", "--workers", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["tokenized"] == result["train_tokens"] + result["val_tokens"] > 0 and result["workers"] == 1
    assert main(["prepare", str(experiment), "--quiet"]) == 0
    assert "(already prepared)" in capsys.readouterr().out
