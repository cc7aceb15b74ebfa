"""Named Llama-style model flavours: tiny ones that train on a CPU, and the published
architectures of large models as shape data (for memory and throughput models).

Pure data: no torch import, so the config validator and `copus.core` can use it.
Shapes of the large models are from their published configs (Hugging Face config.json of
meta-llama/Llama-3.2-3B, meta-llama/Llama-2-7b-hf, meta-llama/Llama-2-13b-hf,
Qwen/Qwen2.5-32B).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from copus.core.layout import ModelShape

# Above this many parameters a flavour is never instantiated on a CPU.
CPU_PARAM_LIMIT = 50_000_000


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3's RoPE frequency scaling (Hugging Face rope_type "llama3"): wavelengths longer
    than original_max_position_embeddings / low_freq_factor are stretched by `factor`, shorter
    than original / high_freq_factor kept, the band between interpolated smoothly."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelFlavour:
    name: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int
    max_seq_len: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    qkv_bias: bool = False
    rope_scaling: Llama3RopeScaling | None = None
    family: str = "llama"  # the registered model family that builds it (workloads.registry)

    def __post_init__(self) -> None:
        for name in ("rope_theta", "norm_eps"):  # RoPE divides by theta's powers, RMSNorm by sqrt(x + eps)
            if not positive_number(getattr(self, name)):
                raise ValueError(f"{name} must be a positive finite number (got {getattr(self, name)!r})")
        if self.dim % self.n_heads:
            raise ValueError(f"{self.name}: dim {self.dim} not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{self.name}: n_heads {self.n_heads} not divisible by n_kv_heads {self.n_kv_heads}")

    def shape(self) -> ModelShape:
        """What the layout rules need to know of the model."""
        return ModelShape(
            self.n_layers,
            self.n_heads,
            self.n_kv_heads,
            self.ffn_dim,
            self.vocab_size,
            self.dim,
            self.qkv_bias,
            self.tie_embeddings,
        )

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def param_count(self) -> int:
        return self.shape().param_count()

    @property
    def trainable_on_cpu(self) -> bool:
        return self.param_count() <= CPU_PARAM_LIMIT

    def as_dict(self) -> dict:
        """Plain JSON-able values (kept with checkpoints, so `copus export` knows the shape)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelFlavour":
        scaling = data.get("rope_scaling")
        return cls(**{**data, "rope_scaling": Llama3RopeScaling(**scaling) if scaling else None})


def positive_number(value) -> bool:
    """A finite number above zero (a bool is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _flavours(*items: ModelFlavour) -> dict[str, ModelFlavour]:
    return {f.name: f for f in items}


BYTE_VOCAB = 256  # byte-level tokens for the built-in corpus and .txt/.jsonl files

FLAVOURS: dict[str, ModelFlavour] = _flavours(
    # ~0.13 M parameters: unit tests and multi-process equivalence checks.
    ModelFlavour(
        "debug", dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=176, vocab_size=BYTE_VOCAB, max_seq_len=512
    ),
    # ~0.5 M parameters: as debug with 8 layers, for pipelines of up to 8 stages in tests.
    ModelFlavour(
        "debug-deep", dim=64, n_layers=8, n_heads=4, n_kv_heads=2, ffn_dim=176, vocab_size=BYTE_VOCAB, max_seq_len=512
    ),
    # ~0.8 M parameters: the quickstart; trains to ~2 nats/byte on 2 CPU cores in minutes.
    ModelFlavour(
        "tiny", dim=128, n_layers=4, n_heads=4, n_kv_heads=4, ffn_dim=352, vocab_size=BYTE_VOCAB, max_seq_len=1024
    ),
    # ~3.1 M parameters: a slower CPU workload where layout choice matters more.
    ModelFlavour(
        "small", dim=256, n_layers=4, n_heads=8, n_kv_heads=4, ffn_dim=704, vocab_size=BYTE_VOCAB, max_seq_len=1024
    ),
    # Published architectures, shape data only on CPU. Qwen2.5-32B is the base model (rms_norm_eps
    # 1e-5; the Instruct model's config says 1e-6).
    ModelFlavour(
        "llama-3.2-3b",
        dim=3072,
        n_layers=28,
        n_heads=24,
        n_kv_heads=8,
        ffn_dim=8192,
        vocab_size=128256,
        max_seq_len=131072,
        rope_theta=500000.0,
        tie_embeddings=True,
        rope_scaling=Llama3RopeScaling(
            factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
        ),
    ),
    ModelFlavour(
        "llama-2-7b",
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=32,
        ffn_dim=11008,
        vocab_size=32000,
        max_seq_len=4096,
    ),
    ModelFlavour(
        "llama-2-13b",
        dim=5120,
        n_layers=40,
        n_heads=40,
        n_kv_heads=40,
        ffn_dim=13824,
        vocab_size=32000,
        max_seq_len=4096,
    ),
    ModelFlavour(
        "qwen-2.5-32b",
        dim=5120,
        n_layers=64,
        n_heads=40,
        n_kv_heads=8,
        ffn_dim=27648,
        vocab_size=152064,
        max_seq_len=131072,
        rope_theta=1000000.0,
        norm_eps=1e-5,
        qkv_bias=True,
    ),
)
