"""Fine-tuning from a Hugging Face model through Ray with the copus policy: a tiny sharded Qwen2
saved by transformers, a BPE tokenizer trained on stdlib docstrings, a jsonl corpus. The first
step's loss is transformers' loss on the same batch (the weights came in), training moves them,
and `copus export` of the run gives a directory transformers loads with our logits."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from copus.cli import main
from copus.cluster.driver import run_experiment
from copus.cluster.launch import prepare_plan
from copus.config import config_from_mapping
from copus.parallel.dims import ParallelDims
from copus.train.data import TokenWindows, TrainStream
from copus.train.parallel_model import ParallelModel
from tests.cluster.test_controller import _mapping, _write_scripted_profile
from tests.workloads.hf_helpers import (
    hf_logits,
    make_hf_model,
    rel_diff,
    sample_tokens,
    stdlib_docstrings,
    train_tokenizer,
    write_jsonl,
)
from workloads.hf_config import flavour_from_config

pytestmark = pytest.mark.slow


def test_finetune_from_hf_with_the_copus_policy_then_export(base_mapping, tmp_path, capsys):
    model_dir = make_hf_model(tmp_path / "qwen2", "qwen2", sharded=True)  # untied: the search includes a pipeline
    workload = {
        "init_from": str(model_dir),
        "seq_len": 32,
        "tokenizer": str(train_tokenizer(tmp_path / "tok.json")),
        "dataset": {
            "kind": "jsonl",
            "path": str(write_jsonl(tmp_path / "docs.jsonl", stdlib_docstrings(400))),
            "cache_dir": base_mapping["workload"]["dataset"]["cache_dir"],
        },
    }
    mapping = {
        **_mapping(base_mapping),
        "workload": workload,
        "stop": {"max_steps": 8},
        "checkpoint": {"every_steps": 4},
    }
    cfg = config_from_mapping(mapping)
    _write_scripted_profile(cfg)  # the copus policy plans from a profile table: a scripted one, no profiling run
    summary = run_experiment(cfg, echo=lambda line: None)
    assert summary["steps"] == 8 and summary["policy"] == "copus"

    # Step 1 trained the Hugging Face weights: its loss is transformers' on the same samples.
    _, plan = prepare_plan(cfg)
    windows = TokenWindows(plan.train_tokens, plan.token_dtype, plan.seq_len)
    inputs, targets = windows.batch(TrainStream(windows, plan.seed).next_global_batch(plan.gbs))
    expected = F.cross_entropy(hf_logits(model_dir, inputs).flatten(0, 1), targets.flatten()).item()
    records = [json.loads(line) for line in (cfg.resolved_output_dir() / "records.jsonl").read_text().splitlines()]
    first = next(r for r in records if r.get("kind") == "step" and r["step"] == 1)
    assert first["train_loss"] == pytest.approx(expected, rel=1e-4)

    out = tmp_path / "exported"
    assert main(["export", str(cfg.resolved_output_dir()), str(out)]) == 0
    assert "exported step 8" in capsys.readouterr().out
    tokens = sample_tokens()
    ours = ParallelModel(
        flavour_from_config(out), 32, 0, ParallelDims(1, 1, 1), torch.device("cpu"), init_from=str(out)
    )
    with torch.no_grad():
        exported_logits = ours.module.eval()(tokens)
    assert rel_diff(exported_logits, hf_logits(out, tokens)) < 1e-4
    assert rel_diff(exported_logits, hf_logits(model_dir, tokens)) > 1e-3  # fine-tuning changed the weights
