"""The in-place reshard's transfer plan, executed on numpy arrays: every rank of the new layout
ends up with exactly its slice of every tensor, whatever the two layouts, and no rank moves
more than the round limit at once."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from copus.core.layout import stage_layer_ranges
from copus.core.transfer_plan import Box, ReshardError, plan_transfers, traffic

# A small decoder's state: (shape, dim sharded by tensor parallelism or None, layer or None
# for the embedding (first stage) / head (last stage)).
N_LAYERS = 8
TENSORS = {"embed": ((64, 16), 0, "first"), "head": ((64, 16), 0, "last"), "norm": ((16,), None, "last")}
for i in range(N_LAYERS):
    TENSORS[f"l{i}.wq"] = ((16, 16), 0, i)
    TENSORS[f"l{i}.wo"] = ((16, 16), 1, i)
    TENSORS[f"l{i}.norm"] = ((16,), None, i)
    TENSORS[f"l{i}.step"] = ((), None, i)  # a 0-d tensor, like AdamW's step
ITEMSIZE = {k: 4 for k in TENSORS}
LAYOUTS_8 = [(2, 2, 2), (4, 2, 1), (2, 1, 4), (8, 1, 1), (1, 1, 8), (1, 2, 4), (4, 1, 2), (2, 4, 1), (1, 8, 1)]


def holdings(dp: int, tp: int, pp: int) -> list[dict[str, Box]]:
    """Each rank's boxes under (dp, tp, pp), ranks ordered (pp, dp, tp) as in ParallelDims."""
    ranges = stage_layer_ranges(N_LAYERS, pp)
    out = []
    for rank in range(dp * tp * pp):
        stage, rest = divmod(rank, dp * tp)
        tp_rank = rest % tp
        boxes = {}
        for key, (shape, dim, where) in TENSORS.items():
            on_stage = (
                (where == "first" and stage == 0)
                or (where == "last" and stage == pp - 1)
                or (isinstance(where, int) and where in ranges[stage])
            )
            if not on_stage:
                continue
            offset, size = [0] * len(shape), list(shape)
            if dim is not None and tp > 1:
                size[dim] = shape[dim] // tp
                offset[dim] = tp_rank * size[dim]
            boxes[key] = Box(tuple(offset), tuple(size))
        out.append(boxes)
    return out


def execute(rounds, old, new, values) -> list[dict[str, np.ndarray]]:
    """Run the plan: old ranks hold slices of `values`, new ranks start empty (NaN)."""
    held = [
        {k: values[k][tuple(slice(o, o + n) for o, n in zip(b.offset, b.shape))].copy() for k, b in boxes.items()}
        for boxes in old
    ]
    got = [{k: np.full(b.shape, np.nan) for k, b in boxes.items()} for boxes in new]
    for transfers in rounds:
        for t in transfers:
            got[t.dst][t.key][t.piece.relative_to(t.needed)] = held[t.src][t.key][t.piece.relative_to(t.held)]
    return got


def values_for() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {k: rng.normal(size=shape) for k, (shape, _, _) in TENSORS.items()}


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(LAYOUTS_8), st.sampled_from(LAYOUTS_8), st.sampled_from([64, 1000, 1 << 30]))
def test_every_new_rank_gets_exactly_its_slices(before, after, round_bytes):
    old, new = holdings(*before), holdings(*after)
    rounds = plan_transfers(old, new, ITEMSIZE, round_bytes)
    values = values_for()
    got = execute(rounds, old, new, values)
    for rank, boxes in enumerate(new):
        for key, b in boxes.items():
            want = values[key][tuple(slice(o, o + n) for o, n in zip(b.offset, b.shape))]
            np.testing.assert_array_equal(got[rank][key], want, err_msg=f"{before}->{after} rank {rank} {key}")
    # A round moves at most round_bytes per rank, unless one piece alone is larger.
    for transfers in rounds:
        load: dict[int, int] = {}
        for t in transfers:
            if t.src != t.dst:
                for r in (t.src, t.dst):
                    load[r] = load.get(r, 0) + t.piece.numel * 4
        biggest = max((t.piece.numel * 4 for t in transfers if t.src != t.dst), default=0)
        assert max(load.values(), default=0) <= max(round_bytes, biggest)


def test_a_rank_that_holds_a_piece_copies_it_and_the_same_layout_moves_nothing():
    old = holdings(2, 2, 2)
    rounds = plan_transfers(old, holdings(2, 2, 2), ITEMSIZE)
    assert traffic(rounds, ITEMSIZE)["bytes_moved"] == 0
    # Full replicas cut into stages: every new stage is already on its rank.
    assert traffic(plan_transfers(holdings(8, 1, 1), holdings(1, 1, 8), ITEMSIZE), ITEMSIZE)["bytes_moved"] == 0


def test_replicas_share_the_sending():
    # (2,1,2) -> (4,1,1) on 4 ranks: ranks 0 and 1 (stage 0) need stage 1's tensors, held by
    # ranks 2 and 3 (two data-parallel replicas): both send, about equally.
    rounds = plan_transfers(holdings(2, 1, 2), holdings(4, 1, 1), ITEMSIZE)
    sent = {r: 0 for r in range(4)}
    for transfers in rounds:
        for t in transfers:
            if t.src != t.dst:
                sent[t.src] += t.piece.numel * 4
    biggest = max(np.prod(shape) * 4 for shape, _, _ in TENSORS.values())
    assert sent[2] > 0 and sent[3] > 0 and abs(sent[2] - sent[3]) <= biggest


def test_state_no_rank_holds_is_refused_with_its_name():
    old = holdings(2, 1, 1)
    for boxes in old:
        del boxes["l3.wq"]
    with pytest.raises(ReshardError, match="l3.wq: rank 0 needs it and no rank holds it"):
        plan_transfers(old, holdings(1, 2, 1), ITEMSIZE)
    partial = holdings(1, 2, 1)
    del partial[1]["l3.wo"]  # half of a sharded tensor is gone
    with pytest.raises(ReshardError, match="l3.wo: rank 0 needs 256 elements, the old layout holds 128"):
        plan_transfers(partial, holdings(2, 1, 1), ITEMSIZE)
