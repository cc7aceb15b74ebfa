"""Hugging Face inputs that are not layouts: Llama 3 RoPE scaling against transformers, the
published flavours' settings, config.json in its older form, and bad model directories and
tokenizers refused by `copus run` with one line before anything starts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from tests.test_bad_input import _set, assert_refused_before_start
from tests.workloads.hf_helpers import make_hf_model, stdlib_docstrings, train_tokenizer, write_jsonl
from workloads.flavours import FLAVOURS, Llama3RopeScaling
from workloads.hf_config import flavour_from_config
from workloads.llama import flavour_rope_tables, rope_tables


def test_published_flavours_rope_scaling_and_norm_eps():
    assert FLAVOURS["llama-3.2-3b"].rope_scaling == Llama3RopeScaling(32.0, 1.0, 4.0, 8192)
    assert FLAVOURS["qwen-2.5-32b"].norm_eps == 1e-5  # the base model's config (the Instruct one says 1e-6)


def test_llama3_frequencies_equal_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    f = FLAVOURS["llama-3.2-3b"]
    s = f.rope_scaling
    config = LlamaConfig(
        hidden_size=f.dim,
        num_attention_heads=f.n_heads,
        max_position_embeddings=f.max_seq_len,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": f.rope_theta,
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
        },
    )
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](config, torch.device("cpu"))
    cos, sin = flavour_rope_tables(f, 4096)
    angles = torch.outer(torch.arange(4096, dtype=torch.float32), inv_freq)
    torch.testing.assert_close(cos, angles.cos(), rtol=0, atol=1e-6)
    torch.testing.assert_close(sin, angles.sin(), rtol=0, atol=1e-6)
    unscaled, _ = rope_tables(f.head_dim, 4096, f.rope_theta)
    assert not torch.allclose(cos, unscaled)  # the low frequencies did change


def test_older_config_json_form(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "intermediate_size": 96,
                "vocab_size": 300,
                "rms_norm_eps": 1e-5,
                "rope_theta": 500000.0,
                "max_position_embeddings": 1024,
                "rope_scaling": {
                    "type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 512,
                },
            }
        )
    )
    f = flavour_from_config(tmp_path)
    assert (f.dim, f.n_kv_heads, f.vocab_size, f.rope_theta, f.norm_eps) == (64, 2, 300, 500000.0, 1e-5)
    assert f.rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 512) and not f.qkv_bias


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("hf-inputs")
    return {
        "llama": make_hf_model(root / "llama", "llama"),
        "qwen2": make_hf_model(root / "qwen2", "qwen2", sharded=True),
        "tokenizer": train_tokenizer(root / "tokenizer.json", vocab_size=400),
        "big_tokenizer": train_tokenizer(root / "big.json", vocab_size=600),
        "corpus": write_jsonl(root / "docs.jsonl", stdlib_docstrings(60)),
    }


def _edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _first_shard(d: Path) -> Path:
    return d / sorted(set(json.loads((d / "model.safetensors.index.json").read_text())["weight_map"].values()))[0]


# (id, which model to copy, how to break the copy, the message after "copus: workload.init_from: ")
BROKEN = [
    ("missing-shard", "qwen2", lambda d: _first_shard(d).unlink(), "{d}/model-00001-of-"),
    (
        "shape-mismatch",
        "llama",
        lambda d: _edit_json(d / "config.json", intermediate_size=128),
        "{d}/model.safetensors: model.layers.0.mlp.gate_proj.weight has shape [96, 64], config.json gives [128, 64]",
    ),
    (
        "architecture",
        "llama",
        lambda d: _edit_json(d / "config.json", architectures=["GPT2LMHeadModel"]),
        "{d}/config.json: architecture GPT2LMHeadModel is not supported",
    ),
    (
        "rope-type",
        "llama",
        lambda d: _edit_json(d / "config.json", rope_parameters={"rope_type": "yarn", "factor": 4.0}),
        "{d}/config.json: RoPE scaling type 'yarn' is not supported",
    ),
    (
        "attention-bias",
        "llama",
        lambda d: _edit_json(d / "config.json", attention_bias=True),
        "{d}/config.json: attention_bias: true is not supported",
    ),
    (
        "corrupt-safetensors",
        "llama",
        lambda d: (d / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{garbage"),
        "{d}/model.safetensors: not a readable safetensors file",
    ),
    (
        "truncated-safetensors",
        "qwen2",
        lambda d: _first_shard(d).write_bytes(_first_shard(d).read_bytes()[:-100]),
        "{d}/model-00001-of-",
    ),
]


def _experiment(base_mapping: dict, tmp_path: Path, changes: dict) -> Path:
    mapping = base_mapping
    for key, value in changes.items():
        mapping = _set(mapping, key, value)
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(mapping))
    return path


def _without_model(base_mapping: dict) -> dict:
    return {**base_mapping, "workload": {k: v for k, v in base_mapping["workload"].items() if k != "model"}}


def _hf_changes(assets: dict, model_dir: Path, tokenizer: Path | None = None) -> dict:
    return {
        "workload.init_from": str(model_dir),
        "workload.tokenizer": str(tokenizer or assets["tokenizer"]),
        "workload.dataset": {"kind": "jsonl", "path": str(assets["corpus"])},
    }


@pytest.mark.parametrize("case,source,breaker,message", BROKEN, ids=[c[0] for c in BROKEN])
def test_a_broken_model_directory_is_refused_before_anything_starts(
    assets, base_mapping, tmp_path, capsys, monkeypatch, case, source, breaker, message
):
    model_dir = tmp_path / "model"
    shutil.copytree(assets[source], model_dir)
    breaker(model_dir)
    experiment = _experiment(_without_model(base_mapping), tmp_path, _hf_changes(assets, model_dir))
    expected = "copus: workload.init_from: " + message.format(d=model_dir.resolve())
    assert_refused_before_start(experiment, expected, base_mapping, tmp_path, capsys, monkeypatch)


@pytest.mark.parametrize("case", ["tokenizer-too-large", "model-and-init-from", "tokenizer-on-stdlib"])
def test_other_bad_inputs_are_refused_before_anything_starts(assets, base_mapping, tmp_path, capsys, monkeypatch, case):
    changes = _hf_changes(assets, assets["llama"])
    mapping = _without_model(base_mapping)
    if case == "tokenizer-too-large":
        changes["workload.tokenizer"] = str(assets["big_tokenizer"])
        expected = f"copus: workload.tokenizer: {assets['big_tokenizer']} has 600 tokens, more than the model's vocabulary of 512"
    elif case == "model-and-init-from":
        mapping = base_mapping
        expected = "copus: workload.model: leave it out when workload.init_from is set"
    else:
        changes["workload.dataset"] = {"kind": "stdlib"}
        expected = "copus: workload.tokenizer: applies to txt, jsonl and parquet data, not 'stdlib'"
    experiment = _experiment(mapping, tmp_path, changes)
    assert_refused_before_start(experiment, expected, base_mapping, tmp_path, capsys, monkeypatch)
