"""Pipeline stages keep the unsplit model's parameter names; rank coordinates follow the mesh."""

from __future__ import annotations

import torch

from copus.parallel.dims import ParallelDims
from workloads.flavours import FLAVOURS
from workloads.llama import build_model, keep_stage


def test_stages_together_hold_the_whole_model_under_its_own_names():
    full = dict(build_model(FLAVOURS["tiny"], 32, seed=1).named_parameters())
    seen: dict[str, torch.Tensor] = {}
    for stage in range(3):
        part = keep_stage(build_model(FLAVOURS["tiny"], 32, seed=1), stage, 3)
        names = dict(part.named_parameters())
        assert not set(names) & set(seen)  # no parameter on two stages
        seen.update(names)
        assert (part.tok_embeddings is not None) == (stage == 0)
        assert (part.output is not None) == (stage == 2)
    assert set(seen) == set(full)
    for name, value in full.items():
        assert torch.equal(seen[name], value), name


def test_stage_forward_chains_to_the_full_forward():
    model = build_model(FLAVOURS["debug"], 16, seed=2).eval()
    stages = [keep_stage(build_model(FLAVOURS["debug"], 16, seed=2), s, 2).eval() for s in range(2)]
    tokens = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(stages[1](stages[0](tokens)), model(tokens))


def test_coordinates_match_the_row_major_pp_dp_tp_mesh():
    dims = ParallelDims(dp=2, tp=2, pp=2)
    grid = torch.arange(8).reshape(2, 2, 2)  # what init_device_mesh lays out for (pp, dp, tp)
    for rank in range(8):
        pp, dp, tp = dims.coordinates(rank)
        assert grid[pp, dp, tp] == rank
