"""Layout rules: stage splits, bubble fraction, and the problems an impossible layout reports."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from copus.core.layout import ModelShape, bubble_fraction, layout_problems, stage_layer_ranges

SHAPE = ModelShape(n_layers=4, n_heads=4, n_kv_heads=4, ffn_dim=352, vocab_size=256)


@given(n_layers=st.integers(1, 96), pp=st.integers(1, 96))
def test_stages_partition_layers_in_order_and_balanced(n_layers, pp):
    if pp > n_layers:
        return
    ranges = stage_layer_ranges(n_layers, pp)
    assert [i for r in ranges for i in r] == list(range(n_layers))
    sizes = [len(r) for r in ranges]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_bubble_fraction():
    assert bubble_fraction(1, 8) == 0
    assert bubble_fraction(4, 4) == 3 / 7
    assert bubble_fraction(2, 2) == 1 / 3


def test_valid_layouts_have_no_problems():
    for dp, tp, pp in [(8, 1, 1), (2, 2, 2), (1, 4, 2), (2, 1, 4)]:
        assert layout_problems(dp, tp, pp, SHAPE, 8, gbs=64, mbs=2) == []


def test_problems_name_the_field():
    assert layout_problems(1, 3, 1, SHAPE) == [("parallel.tp", "3 does not divide the model's 4 attention heads")]
    assert layout_problems(1, 1, 5, SHAPE)[0][0] == "parallel.pp"
    assert layout_problems(2, 1, 1, SHAPE, world_size=4)[0][0] == "cluster.num_workers"
    assert layout_problems(2, 1, 4, SHAPE, gbs=8, mbs=2) == [
        ("batch.gbs", "8 gives 2 micro-batches per replica (gbs / (dp x mbs)), fewer than the 4 pipeline stages")
    ]


def test_tied_embeddings_refuse_pipeline_stages():
    tied = ModelShape(n_layers=4, n_heads=4, n_kv_heads=4, ffn_dim=352, vocab_size=256, dim=128, tie_embeddings=True)
    assert layout_problems(2, 1, 1, tied, 2) == []
    assert [f for f, _ in layout_problems(1, 1, 2, tied, 2)] == ["parallel.pp"]
