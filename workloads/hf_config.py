"""Hugging Face model directories, the parts that need no torch: config.json to a
`ModelFlavour` and back, the tensor names of our model in Hugging Face's naming, and a check of
the safetensors files (present, readable, every tensor there with the right shape) that runs
in the config validator, before anything starts.

Supported: LlamaForCausalLM and Qwen2ForCausalLM with SiLU MLPs, RoPE without scaling or with
Llama 3's scaling. Anything else is refused with one line naming the file and the feature.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from workloads.flavours import Llama3RopeScaling, ModelFlavour, positive_number

CONFIG = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX = "model.safetensors.index.json"
ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
ROPE_TYPES = ("default", "llama3")
# Our module path -> Hugging Face's, inside a decoder layer and at the top level.
LAYER_NAMES = {
    "attention.wq": "self_attn.q_proj",
    "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj",
    "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w3": "mlp.up_proj",
    "feed_forward.w2": "mlp.down_proj",
    "attention_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
TOP_NAMES = {"tok_embeddings": "model.embed_tokens", "norm": "model.norm", "output": "lm_head"}
# Buffers older checkpoints carry that the model recomputes.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class HFModelError(ValueError):
    """A problem with a Hugging Face model directory, phrased as one line naming the file."""


def hf_name(name: str) -> str:
    """Our parameter name -> Hugging Face's: "layers.3.attention.wq.weight" ->
    "model.layers.3.self_attn.q_proj.weight"."""
    module, _, leaf = name.rpartition(".")
    if module.startswith("layers."):
        _, index, rest = module.split(".", 2)
        return f"model.layers.{index}.{LAYER_NAMES[rest]}.{leaf}"
    return f"{TOP_NAMES[module]}.{leaf}"


def architecture_of(flavour: ModelFlavour) -> str:
    # Qwen2 is Llama with q/k/v biases: the only difference our model has.
    return "Qwen2ForCausalLM" if flavour.qkv_bias else "LlamaForCausalLM"


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise HFModelError(f"{path}: not found (a Hugging Face model directory holds {CONFIG} and *.safetensors)")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise HFModelError(f"{path}: not readable JSON ({err})") from None
    if not isinstance(data, dict):
        raise HFModelError(f"{path}: expected a JSON object")
    return data


def _architecture(raw: dict, path: Path) -> str:
    names = raw.get("architectures") or []
    if isinstance(names, str):  # one name where transformers writes a list of one
        names = [names]
    if not isinstance(names, list):
        raise HFModelError(f"{path}: architectures must be a list of class names (got {names!r})")
    if not names:
        by_type = {v: k for k, v in ARCHITECTURES.items()}
        names = [by_type.get(raw.get("model_type"), f"model_type {raw.get('model_type')!r}")]
    if len(names) != 1 or names[0] not in ARCHITECTURES:
        raise HFModelError(
            f"{path}: architecture {', '.join(map(str, names))} is not supported "
            f"(supported: {', '.join(ARCHITECTURES)})"
        )
    return names[0]


def _rope(raw: dict, path: Path) -> tuple[float, Llama3RopeScaling | None]:
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
        raise HFModelError(f"{path}: RoPE parameters per layer type are not supported")
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    if params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)) != 1.0:
        raise HFModelError(f"{path}: partial_rotary_factor other than 1 is not supported")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise HFModelError(f"{path}: RoPE scaling type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
    if kind == "default":
        return theta, None
    try:
        return theta, Llama3RopeScaling(
            _positive(params["factor"], "factor", path),
            _positive(params["low_freq_factor"], "low_freq_factor", path),
            _positive(params["high_freq_factor"], "high_freq_factor", path),
            _required_int(
                {"x": params.get("original_max_position_embeddings", raw["max_position_embeddings"])},
                "x",
                path,
                "original_max_position_embeddings",
            ),
        )
    except KeyError as err:
        raise HFModelError(f"{path}: llama3 RoPE scaling without {err.args[0]}") from None


def _positive(value, key: str, path: Path) -> float:
    if not positive_number(value):
        raise HFModelError(f"{path}: {key} must be a positive finite number (got {value!r})")
    return float(value)


def _refuse_unsupported(raw: dict, architecture: str, path: Path) -> None:
    if raw.get("hidden_act", "silu") != "silu":
        raise HFModelError(f"{path}: hidden_act {raw['hidden_act']!r} is not supported (the MLP is SwiGLU: silu)")
    if architecture == "LlamaForCausalLM":
        if raw.get("attention_bias"):
            raise HFModelError(
                f"{path}: attention_bias: true is not supported (the model's Llama attention has no biases)"
            )
        if raw.get("mlp_bias"):
            raise HFModelError(f"{path}: mlp_bias: true is not supported (the model's MLP has no biases)")
    if raw.get("use_sliding_window"):
        raise HFModelError(f"{path}: use_sliding_window: true is not supported (full causal attention only)")
    layer_types = raw.get("layer_types") or []
    if not isinstance(layer_types, list) or any(t != "full_attention" for t in layer_types):
        raise HFModelError(f"{path}: layer_types other than full_attention are not supported")


def _required_int(raw: dict, key: str, path: Path, name: str | None = None) -> int:
    value = raw.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise HFModelError(f"{path}: {name or key} must be a positive integer (got {value!r})")
    return value


def flavour_from_config(model_dir: str | Path) -> ModelFlavour:
    """The model shape of a Hugging Face model directory (its config.json)."""
    path = Path(model_dir).expanduser().resolve() / CONFIG
    return _cached_flavour(str(path), path.stat().st_mtime_ns if path.is_file() else 0)


@lru_cache(maxsize=16)
def _cached_flavour(config_path: str, _mtime: int) -> ModelFlavour:
    path = Path(config_path)
    raw = _read_json(path)
    architecture = _architecture(raw, path)
    _refuse_unsupported(raw, architecture, path)
    dims = {
        k: _required_int(raw, k, path)
        for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    }
    heads = dims["num_attention_heads"]
    head_dim = raw.get("head_dim")
    if head_dim is not None and head_dim * heads != dims["hidden_size"]:
        raise HFModelError(
            f"{path}: head_dim {head_dim} x {heads} heads differs from hidden_size "
            f"{dims['hidden_size']} (not supported)"
        )
    theta, scaling = _rope(raw, path)
    n_kv_heads = _required_int(raw, "num_key_value_heads", path) if raw.get("num_key_value_heads") else heads
    max_seq_len = _required_int({"max_position_embeddings": 2048, **raw}, "max_position_embeddings", path)
    norm_eps = _positive(raw.get("rms_norm_eps", 1e-6), "rms_norm_eps", path)  # named as config.json names it
    try:  # ModelFlavour checks the rest (rope_theta, head counts)
        return ModelFlavour(
            f"hf:{path.parent.name}",
            dim=dims["hidden_size"],
            n_layers=dims["num_hidden_layers"],
            n_heads=heads,
            n_kv_heads=n_kv_heads,
            ffn_dim=dims["intermediate_size"],
            vocab_size=dims["vocab_size"],
            max_seq_len=max_seq_len,
            rope_theta=theta,
            norm_eps=norm_eps,
            tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=architecture == "Qwen2ForCausalLM",
            rope_scaling=scaling,
        )
    except ValueError as err:
        raise HFModelError(f"{path}: {err}") from None


def workload_flavour(model: str, init_from: str | None) -> ModelFlavour:
    """The flavour a run trains: the Hugging Face directory's when it starts from one, else the
    named one."""
    from workloads.flavours import FLAVOURS

    return flavour_from_config(init_from) if init_from else FLAVOURS[model]


def config_from_flavour(flavour: ModelFlavour, dtype: str = "float32") -> dict:
    """A config.json transformers loads into the same model."""
    architecture = architecture_of(flavour)
    rope = {"rope_type": "default", "rope_theta": flavour.rope_theta}
    if flavour.rope_scaling is not None:
        rope = {**rope, "rope_type": "llama3", **vars(flavour.rope_scaling)}
    config = {
        "architectures": [architecture],
        "model_type": ARCHITECTURES[architecture],
        "hidden_size": flavour.dim,
        "num_hidden_layers": flavour.n_layers,
        "num_attention_heads": flavour.n_heads,
        "num_key_value_heads": flavour.n_kv_heads,
        "intermediate_size": flavour.ffn_dim,
        "vocab_size": flavour.vocab_size,
        "hidden_act": "silu",
        "max_position_embeddings": flavour.max_seq_len,
        "rms_norm_eps": flavour.norm_eps,
        "rope_parameters": rope,
        "tie_word_embeddings": flavour.tie_embeddings,
        "dtype": dtype,
    }
    if architecture == "LlamaForCausalLM":
        config.update(head_dim=flavour.head_dim, attention_bias=False, mlp_bias=False)
    else:
        config.update(use_sliding_window=False, max_window_layers=flavour.n_layers)
    return config


def parameter_shapes(f: ModelFlavour) -> dict[str, tuple[int, ...]]:
    """Our parameter names and shapes for the whole model (the LM head only when untied)."""
    q, kv = f.n_heads * f.head_dim, f.n_kv_heads * f.head_dim
    shapes: dict[str, tuple[int, ...]] = {"tok_embeddings.weight": (f.vocab_size, f.dim), "norm.weight": (f.dim,)}
    if not f.tie_embeddings:
        shapes["output.weight"] = (f.vocab_size, f.dim)
    for i in range(f.n_layers):
        layer = {
            "attention.wq.weight": (q, f.dim),
            "attention.wk.weight": (kv, f.dim),
            "attention.wv.weight": (kv, f.dim),
            "attention.wo.weight": (f.dim, q),
            "feed_forward.w1.weight": (f.ffn_dim, f.dim),
            "feed_forward.w3.weight": (f.ffn_dim, f.dim),
            "feed_forward.w2.weight": (f.dim, f.ffn_dim),
            "attention_norm.weight": (f.dim,),
            "ffn_norm.weight": (f.dim,),
        }
        if f.qkv_bias:
            layer.update({"attention.wq.bias": (q,), "attention.wk.bias": (kv,), "attention.wv.bias": (kv,)})
        shapes.update({f"layers.{i}.{k}": v for k, v in layer.items()})
    return shapes
