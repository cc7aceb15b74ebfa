"""ParallelDims: the (dp, tp, pp) layout of one run and its DeviceMesh.

The mesh is (pp, dp, tp) with named dims, tp innermost so tensor-parallel peers are
neighbouring ranks (the same node on a GPU cluster) and pp outermost. The mesh is built on
first use and kept on this object: callers pass the object (or its groups) explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from copus.core.layout import ModelShape, layout_problems

MESH_DIMS = ("pp", "dp", "tp")


class LayoutError(ValueError):
    pass


@dataclass
class ParallelDims:
    dp: int
    tp: int
    pp: int
    _mesh: DeviceMesh | None = field(default=None, repr=False, compare=False)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def validate(
        self, shape: ModelShape, world_size: int | None = None, gbs: int | None = None, mbs: int | None = None
    ) -> None:
        problems = layout_problems(self.dp, self.tp, self.pp, shape, world_size, gbs, mbs)
        if problems:
            raise LayoutError("; ".join(f"{f}: {m}" for f, m in problems))

    def mesh(self, device_type: str) -> DeviceMesh:
        if self._mesh is None:
            self._mesh = init_device_mesh(device_type, (self.pp, self.dp, self.tp), mesh_dim_names=MESH_DIMS)
        return self._mesh

    def release(self) -> None:
        """Destroy the mesh's process groups (not the world group, which a dimension spanning
        every rank reuses). Called on every rank, in the same order, when a layout is replaced
        in place: each gloo group holds connections and threads, and a run may change layout
        many times."""
        if self._mesh is None:
            return
        # Every rank past its last operation on these groups before any rank closes them: a
        # group's connections closed while a peer still reads from them (a broadcast it has not
        # finished receiving) fail that peer with "Connection closed by peer". The world group
        # lives on, so waiting on it is safe.
        dist.barrier()
        world = dist.group.WORLD
        for name in MESH_DIMS:
            group = self._mesh.get_group(name)
            if group is not None and group != world and group != dist.GroupMember.NON_GROUP_MEMBER:
                dist.destroy_process_group(group)
        self._mesh = None
        clear_mesh_caches()

    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """(pp, dp, tp) index of a global rank in the (pp, dp, tp) row-major mesh."""
        pp_idx, rest = divmod(rank, self.dp * self.tp)
        dp_idx, tp_idx = divmod(rest, self.tp)
        return pp_idx, dp_idx, tp_idx


def clear_mesh_caches() -> None:
    """Drop DTensor's caches of sharding decisions. They are keyed by DeviceMesh, and meshes
    over the same ranks compare equal: a decision cached under one layout hands DTensors of
    another layout the first one's mesh (parameters built on the new mesh come out on the old
    one, whose process groups are then destroyed: "Could not resolve the process group"), and
    the caches keep every old mesh alive. So: clear them before a second layout is built in a
    process and after one is released, and never run DTensor ops of two layouts interleaved.
    These are private torch attributes (checked against torch 2.13): the in-place
    reconfiguration tests fail loudly if a torch upgrade moves them."""
    import torch
    from torch.distributed.tensor import DTensor, _collective_utils, _redistribute, _sharding_prop

    torch._C._clear_DTensor_sharding_propagator_cache()  # the C++ dispatch fast path's copy
    prop = DTensor._op_dispatcher.sharding_propagator
    # A fresh per-thread cache object: the autograd threads' caches go too, not only this one's.
    prop.propagate_op_sharding = _sharding_prop.LocalLRUCache(prop.propagate_op_sharding_non_cached)
    _redistribute.clear_redistribute_planner_cache()
    _redistribute._gen_transform_infos.cache_clear()
    _collective_utils.MeshTopoInfo.build_from_mesh.cache_clear()
