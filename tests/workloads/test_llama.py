"""The Llama-style workload: causal, deterministic, published shapes."""

from __future__ import annotations

import pytest
import torch

from workloads.flavours import FLAVOURS
from workloads.llama import build_model


def test_published_parameter_counts():
    # Published sizes: 3.21 B, 6.74 B, 13.0 B, 32.8 B.
    expected = {"llama-3.2-3b": 3.21e9, "llama-2-7b": 6.74e9, "llama-2-13b": 13.0e9, "qwen-2.5-32b": 32.76e9}
    for name, count in expected.items():
        assert FLAVOURS[name].param_count() == pytest.approx(count, rel=0.01), name
        assert not FLAVOURS[name].trainable_on_cpu


@pytest.mark.parametrize("flavour", ["debug", "tiny"])
def test_param_count_formula_matches_the_module(flavour):
    model = build_model(FLAVOURS[flavour], 32, seed=0)
    assert sum(p.numel() for p in model.parameters()) == FLAVOURS[flavour].param_count()


def test_attention_is_causal_and_output_shape():
    model = build_model(FLAVOURS["debug"], 32, seed=0).eval()
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[:, 20:] = (changed[:, 20:] + 1) % 256
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert a.shape == (2, 32, 256)
    torch.testing.assert_close(a[:, :20], b[:, :20])  # the future does not leak into the past
    assert not torch.allclose(a[:, 20:], b[:, 20:])


def test_initialisation_is_deterministic_per_parameter_name():
    a = build_model(FLAVOURS["debug"], 32, seed=3)
    b = build_model(FLAVOURS["debug"], 32, seed=3)
    c = build_model(FLAVOURS["debug"], 32, seed=4)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if not name.endswith("norm.weight"):
            assert not torch.equal(pa, pc), name


def test_a_materialised_stage_equals_the_same_part_of_the_whole_model():
    from workloads.llama import keep_stage, materialize, skeleton

    whole = dict(build_model(FLAVOURS["tiny"], 32, seed=5).named_parameters())
    part = skeleton(FLAVOURS["tiny"], 32)
    assert all(p.is_meta for p in part.parameters())
    stage = materialize(keep_stage(part, 1, 2), seed=5)
    for name, p in stage.named_parameters():
        assert torch.equal(p, whole[name]), name
    assert not stage.rope_cos.is_meta
