"""Tiny Hugging Face models and a BPE tokenizer, made in the tests without any network:
random Llama and Qwen2 models saved with transformers' save_pretrained, and a tokenizer trained
with `tokenizers` on docstrings of the standard library."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from workloads.demo_data import stdlib_docstrings, train_bpe_tokenizer

VOCAB = 512
SEQ = 32
# Llama 3's scaling with a short original context, so that it changes frequencies a 16-wide head uses.
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
    "rope_theta": 500000.0,
}


def make_hf_model(directory: Path, arch: str, sharded: bool = False, **overrides) -> Path:
    """A random tiny model of `arch` ("llama": tied embeddings and Llama 3 RoPE scaling, one
    file; "qwen2": q/k/v biases, untied) saved with save_pretrained (sharded: many small files)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0 if arch == "llama" else 1)
    shape = dict(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=96,
        vocab_size=VOCAB,
        max_position_embeddings=256,
    )
    if arch == "llama":
        model = LlamaForCausalLM(
            LlamaConfig(**shape, tie_word_embeddings=True, rope_parameters=dict(LLAMA3_ROPE), **overrides)
        )
    else:
        model = Qwen2ForCausalLM(
            Qwen2Config(**shape, rope_parameters={"rope_type": "default", "rope_theta": 1e6}, **overrides)
        )
        with torch.no_grad():  # transformers initialises biases at zero: make them count
            for name, p in model.named_parameters():
                if name.endswith(".bias"):
                    p.normal_(0.0, 0.5)
    model.save_pretrained(directory, **({"max_shard_size": "40KB"} if sharded else {}))
    return directory


def hf_logits(directory: Path, tokens: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(tokens).logits


def sample_tokens(batch: int = 2, seq: int = SEQ) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(7))


def rel_diff(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """Largest difference relative to the largest reference logit."""
    return float((ours - reference).abs().max() / reference.abs().max())


def train_tokenizer(path: Path, vocab_size: int = 400) -> Path:
    """A byte-level BPE tokenizer.json trained on stdlib docstrings, with an end-of-text token."""
    train_bpe_tokenizer(stdlib_docstrings(400), vocab_size).save(str(path))
    return path


def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path
