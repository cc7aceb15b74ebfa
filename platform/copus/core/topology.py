"""Where a layout's parallel dimensions meet the node boundaries.

Ranks are laid out row-major over the mesh (pp, dp, tp): tensor parallel innermost, then data
parallel, then pipeline outermost, which is Megatron-LM's default order (tp-dp-pp). Ray Train
numbers its workers node by node, so with `ranks_per_node` ranks on each node, rank r lives on
node r // ranks_per_node. A dimension *crosses nodes* when two ranks that differ only in that
dimension's coordinate live on different nodes: its collectives (tp's all-reduces, dp's gradient
reduction, pp's activation sends) then go over the inter-node link instead of the node's own.
"""

from __future__ import annotations

from itertools import product

# Outermost first: the order of the DeviceMesh's dimensions (copus.parallel.dims builds it so).
MESH_ORDER = ("pp", "dp", "tp")


def _strides(sizes: dict[str, int]) -> dict[str, int]:
    strides, stride = {}, 1
    for name in reversed(MESH_ORDER):
        strides[name] = stride
        stride *= sizes[name]
    return strides


def crossing_dims(dp: int, tp: int, pp: int, ranks_per_node: int) -> tuple[str, ...]:
    """The dimensions of layout dp x tp x pp whose groups span more than one node, in mesh
    order. Every rank on one node (ranks_per_node >= world size) gives ()."""
    if min(dp, tp, pp, ranks_per_node) < 1:
        raise ValueError(f"sizes must be positive: dp={dp} tp={tp} pp={pp} ranks_per_node={ranks_per_node}")
    sizes = {"pp": pp, "dp": dp, "tp": tp}
    strides = _strides(sizes)
    crossing = []
    for name in MESH_ORDER:
        others = [range(sizes[o]) for o in MESH_ORDER if o != name]
        for coords in product(*others):
            base = sum(c * strides[o] for c, o in zip(coords, (o for o in MESH_ORDER if o != name)))
            nodes = {(base + k * strides[name]) // ranks_per_node for k in range(sizes[name])}
            if len(nodes) > 1:
                crossing.append(name)
                break
    return tuple(crossing)


def crossing_label(crossing: tuple[str, ...]) -> str:
    """How a table names what crosses nodes: 'pp', 'dp+pp', or '-' for nothing."""
    return "+".join(crossing) if crossing else "-"


def emulated_addresses(subnet: str, nodes: int) -> tuple[str, list[str]]:
    """The head's address (the subnet's first host, on the bridge) and node i's (the subnet's
    host 10 + i, i from 1), of an emulated cluster."""
    import ipaddress

    net = ipaddress.IPv4Network(subnet)
    hosts = list(net.hosts())
    if len(hosts) < 10 + nodes:
        raise ValueError(f"{subnet} has no room for the head and {nodes} nodes")
    return str(hosts[0]), [str(hosts[9 + i]) for i in range(1, nodes + 1)]
