"""Which rank sends which piece of which tensor when the model changes layout in place.

Every rank holds, for each state tensor it keeps (a parameter, an AdamW moment), one box of the
full ("global") tensor: an offset and a shape, per dimension. A tensor-parallel shard is a box
cut along one dimension; a replicated or unsharded tensor is the whole tensor; a pipeline stage
holds no box at all for another stage's layers. Data-parallel replicas hold the same boxes.

`plan_transfers` takes the boxes every rank holds now and the boxes every rank needs in the
new layout and returns the transfers: for each needed box, the pieces it intersects with held
boxes, each taken from one holder. A rank that already holds a piece copies it locally; among
other holders the least loaded one sends (so dp replicas share the sending). The plan is
computed identically on every rank from the same inputs (no randomness, no hashing), and it
refuses to proceed when a needed element is held by no rank.

Transfers are cut into rounds so that no rank sends or receives more than `round_bytes` in one
round: the sender packs its pieces for one receiver into a single buffer per round, which
bounds the extra memory a reconfiguration needs on top of the old and new state.

Pure: no torch, so the planning is unit- and property-tested on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod


class ReshardError(RuntimeError):
    pass


@dataclass(frozen=True)
class Box:
    offset: tuple[int, ...]
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return prod(self.shape)

    def intersect(self, other: "Box") -> "Box | None":
        lo = tuple(max(a, b) for a, b in zip(self.offset, other.offset))
        hi = tuple(min(a + n, b + m) for a, n, b, m in zip(self.offset, self.shape, other.offset, other.shape))
        if any(h <= l for l, h in zip(lo, hi)):  # a 0-d tensor (AdamW's step) always intersects
            return None
        return Box(lo, tuple(h - l for l, h in zip(lo, hi)))

    def relative_to(self, outer: "Box") -> tuple[slice, ...]:
        """This box as index slices into a tensor that holds `outer`."""
        return tuple(slice(a - o, a - o + n) for a, o, n in zip(self.offset, outer.offset, self.shape))


@dataclass(frozen=True)
class Transfer:
    src: int
    dst: int
    key: str
    piece: Box  # in global coordinates
    held: Box  # the box the sender holds (to slice the piece out of it)
    needed: Box  # the box the receiver holds in the new layout (to place the piece in it)


Holdings = dict[str, Box]  # one rank's: state key -> the box of the global tensor it holds


def plan_transfers(
    held: list[Holdings], needed: list[Holdings], itemsize: dict[str, int], round_bytes: int = 256 << 20
) -> list[list[Transfer]]:
    """The transfers that give every rank its `needed` boxes from the ranks' `held` boxes,
    cut into rounds of at most `round_bytes` sent and received per rank (a single piece larger
    than that gets a round of its own)."""
    holders: dict[str, dict[Box, list[int]]] = {}
    for rank, boxes in enumerate(held):
        for key, box in boxes.items():
            holders.setdefault(key, {}).setdefault(box, []).append(rank)
    sent = [0] * len(held)  # bytes each rank sends so far: the balance between replicas
    transfers: list[Transfer] = []
    for dst, boxes in enumerate(needed):
        for key in sorted(boxes):
            box = boxes[key]
            if key not in holders:
                raise ReshardError(f"{key}: rank {dst} needs it and no rank holds it")
            covered = 0
            for held_box in sorted(holders[key], key=lambda b: b.offset):
                piece = box.intersect(held_box)
                if piece is None:
                    continue
                ranks = holders[key][held_box]
                src = dst if dst in ranks else min(ranks, key=lambda r: (sent[r], r))
                if src != dst:
                    sent[src] += piece.numel * itemsize[key]
                transfers.append(Transfer(src, dst, key, piece, held_box, box))
                covered += piece.numel
            if covered != box.numel:
                # Held boxes of one key never overlap (a tensor is sharded, never split twice),
                # so the pieces' sizes add up exactly when the box is fully covered.
                raise ReshardError(
                    f"{key}: rank {dst} needs {box.numel} elements, the old layout holds {covered} of them"
                )
    return _rounds(transfers, itemsize, round_bytes, len(held))


def _rounds(transfers: list[Transfer], itemsize: dict[str, int], round_bytes: int, world: int) -> list[list[Transfer]]:
    rounds: list[list[Transfer]] = []
    current: list[Transfer] = []
    load = [0] * world
    for t in transfers:
        size = 0 if t.src == t.dst else t.piece.numel * itemsize[t.key]
        if current and size and max(load[t.src], load[t.dst]) + size > round_bytes:
            rounds.append(current)
            current, load = [], [0] * world
        current.append(t)
        if size:
            load[t.src] += size
            load[t.dst] += size
    if current:
        rounds.append(current)
    return rounds


def traffic(rounds: list[list[Transfer]], itemsize: dict[str, int]) -> dict[str, int]:
    """Bytes moved between ranks and bytes copied locally, summed over the plan."""
    moved = local = 0
    for r in rounds:
        for t in r:
            n = t.piece.numel * itemsize[t.key]
            if t.src == t.dst:
                local += n
            else:
                moved += n
    return {"bytes_moved": moved, "bytes_local": local}
