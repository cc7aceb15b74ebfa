"""Which parallel dimensions cross nodes (copus.core.topology), checked against the mesh's own
rank coordinates."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from copus.core.topology import MESH_ORDER, crossing_dims, crossing_label, emulated_addresses
from copus.parallel.dims import MESH_DIMS, ParallelDims

POW2 = st.sampled_from([1, 2, 4])


def _crossing_by_coordinates(dp: int, tp: int, pp: int, per_node: int) -> tuple[str, ...]:
    """The reference: group ranks by every coordinate but one (ParallelDims.coordinates)."""
    dims = ParallelDims(dp, tp, pp)
    coords = {r: dict(zip(MESH_DIMS, dims.coordinates(r))) for r in range(dims.world_size)}
    out = []
    for name in MESH_DIMS:
        groups: dict[tuple, set[int]] = {}
        for r, c in coords.items():
            groups.setdefault(tuple(v for k, v in c.items() if k != name), set()).add(r // per_node)
        if any(len(nodes) > 1 for nodes in groups.values()):
            out.append(name)
    return tuple(out)


def test_the_order_is_the_meshs_own():
    assert MESH_ORDER == MESH_DIMS == ("pp", "dp", "tp")


@given(dp=POW2, tp=POW2, pp=POW2, nodes=st.sampled_from([1, 2, 4, 8]))
def test_crossing_matches_the_mesh_coordinates(dp, tp, pp, nodes):
    world = dp * tp * pp
    per_node = max(1, world // nodes)
    assert crossing_dims(dp, tp, pp, per_node) == _crossing_by_coordinates(dp, tp, pp, per_node)


def test_megatrons_order_keeps_tp_in_a_node_and_crosses_pp_first():
    # 8 ranks on 2 nodes of 4: tensor parallel stays inside, the pipeline crosses before dp.
    assert crossing_dims(dp=2, tp=2, pp=2, ranks_per_node=4) == ("pp",)
    assert crossing_dims(dp=4, tp=2, pp=1, ranks_per_node=4) == ("dp",)
    assert crossing_dims(dp=1, tp=8, pp=1, ranks_per_node=4) == ("tp",)
    assert crossing_dims(dp=4, tp=1, pp=1, ranks_per_node=4) == ()
    assert crossing_label(("dp", "pp")) == "dp+pp" and crossing_label(()) == "-"
    with pytest.raises(ValueError, match="positive"):
        crossing_dims(0, 1, 1, 1)


def test_emulated_addresses_leave_the_head_first_and_nodes_from_ten():
    assert emulated_addresses("10.77.0.0/24", 2) == ("10.77.0.1", ["10.77.0.11", "10.77.0.12"])
    with pytest.raises(ValueError, match="no room"):
        emulated_addresses("10.77.0.0/29", 2)
