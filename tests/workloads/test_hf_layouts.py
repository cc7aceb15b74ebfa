"""Hugging Face models loaded under every kind of layout give transformers' logits, and a
checkpoint written by the (2,2,2) layout exports to a directory transformers loads with the same
logits (export round trip).

Per layout, every rank reads only its stage and shard (workloads.hf_weights); the logits of a
pipeline are chained stage to stage here, outside the training schedule."""

from __future__ import annotations

import json

import pytest
import torch

from copus.train.export import export_run
from copus.train.local import run_on_gloo_ranks
from tests.workloads.hf_helpers import hf_logits, make_hf_model, rel_diff, sample_tokens
from tests.workloads.hf_ranks import logits_per_layout

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("hf")
    return {
        "llama": make_hf_model(root / "llama", "llama"),
        "qwen2": make_hf_model(root / "qwen2", "qwen2", sharded=True),
    }


def _check(results: dict, dirs: dict, tokens: torch.Tensor, report: dict) -> None:
    reference = {arch: hf_logits(d, tokens) for arch, d in dirs.items()}
    for (layout, arch), logits in results.items():
        diff = rel_diff(logits, reference[arch])
        report[f"{arch} {layout}"] = diff
        assert diff < 1e-4, (layout, arch, diff)


def test_logits_equal_transformers_under_one_and_two_rank_layouts(hf_dirs):
    tokens, report = sample_tokens(), {}
    _check(logits_per_layout([(1, 1, 1)], hf_dirs, tokens, None), hf_dirs, tokens, report)
    ranks = run_on_gloo_ranks(2, logits_per_layout, [(2, 1, 1), (1, 2, 1), (1, 1, 2)], hf_dirs, tokens, None)
    for rank_results in ranks:  # every rank holds the whole logits
        _check(rank_results, hf_dirs, tokens, report)
    print("max relative logit difference:", json.dumps(report))


def test_2x2x2_logits_and_export_round_trip(hf_dirs, tmp_path):
    tokens, report = sample_tokens(), {}
    checkpoint = tmp_path / "run" / "ray" / "train" / "checkpoint_000001"
    ranks = run_on_gloo_ranks(8, logits_per_layout, [(2, 2, 2)], hf_dirs, tokens, str(checkpoint))
    _check(ranks[0], hf_dirs, tokens, report)
    _check(ranks[7], hf_dirs, tokens, report)

    result = export_run(tmp_path / "run", tmp_path / "exported", max_shard_bytes=60_000)
    assert result["files"] > 1 and (tmp_path / "exported" / "model.safetensors.index.json").is_file()
    exported = hf_logits(tmp_path / "exported", tokens)
    report["qwen2 exported from (2,2,2)"] = rel_diff(exported, hf_logits(hf_dirs["qwen2"], tokens))
    assert report["qwen2 exported from (2,2,2)"] < 1e-6  # the same weights, bit for bit up to layout
    print("max relative logit difference:", json.dumps(report))
