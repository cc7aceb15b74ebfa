"""ParallelDims: the (dp, tp, pp) layout of one run and its DeviceMesh.

The mesh is (pp, dp, tp) with named dims, tp innermost so tensor-parallel peers are
neighbouring ranks (the same node on a GPU cluster) and pp outermost. The mesh is built on
first use and kept on this object: callers pass the object (or its groups) explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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

    def validate(self, shape: ModelShape, world_size: int | None = None, gbs: int | None = None,
                 mbs: int | None = None) -> None:
        problems = layout_problems(self.dp, self.tp, self.pp, shape, world_size, gbs, mbs)
        if problems:
            raise LayoutError("; ".join(f"{f}: {m}" for f, m in problems))

    def mesh(self, device_type: str) -> DeviceMesh:
        if self._mesh is None:
            self._mesh = init_device_mesh(device_type, (self.pp, self.dp, self.tp), mesh_dim_names=MESH_DIMS)
        return self._mesh

    def coordinates(self, rank: int) -> tuple[int, int, int]:
        """(pp, dp, tp) index of a global rank in the (pp, dp, tp) row-major mesh."""
        pp_idx, rest = divmod(rank, self.dp * self.tp)
        dp_idx, tp_idx = divmod(rest, self.tp)
        return pp_idx, dp_idx, tp_idx
