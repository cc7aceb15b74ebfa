"""Unsharded data parallelism (`dp_shard = "none"`): gradients averaged over dp with bucketed
all-reduces that start during the backward pass, as DDP's reducer does.

Why not torch's DistributedDataParallel: it takes plain tensors only, and its tensor-parallel
bridge swaps DTensor parameters for their local shards, which would take the DTensors (and so the
name- and placement-keyed DCP checkpoints and in-place reshards) away from the model; it also
wraps the module, renaming every parameter. The reducer here leaves the model untouched.

How: parameters are cut, in reverse order (roughly the order backward produces their gradients),
into buckets of about `bucket_bytes` each. A post-accumulate-grad hook counts each parameter's
accumulations; after the step's last one its gradient is final, and once a bucket's gradients are
all final the bucket is flattened and its all-reduce launched asynchronously, buckets strictly in
order so every rank issues the same collectives in the same order. `finish()` launches the last
bucket (the first layers', complete only when backward ends, with nothing left to overlap it
with), waits for all, and writes the averages back. Gradients keep their own storage: until
`finish()` they hold this replica's gradient (what the GNS probe measures), and a change made to
the first parameters' gradients after backward (a fault injection) still reaches every replica.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch._utils import _unflatten_dense_tensors
from torch.distributed import ProcessGroup
from torch.distributed.tensor import DTensor

from copus.parallel.grads import align_grad_placement, local_grad

DEFAULT_BUCKET_BYTES = 25 << 20  # DDP's default bucket_cap_mb


@dataclass
class _Bucket:
    params: list[torch.nn.Parameter]
    ready: int = 0
    flat: torch.Tensor | None = None
    work: object = None
    grads: list[torch.Tensor] = field(default_factory=list)


def make_buckets(params: list[torch.nn.Parameter], bucket_bytes: int) -> list[list[torch.nn.Parameter]]:
    """Reverse parameter order, one dtype per bucket, each closed once it reaches bucket_bytes."""
    buckets: list[list[torch.nn.Parameter]] = []
    size = 0
    for p in reversed(params):
        local = p.to_local() if isinstance(p, DTensor) else p
        nbytes = local.numel() * local.element_size()
        if not buckets or size >= bucket_bytes or buckets[-1][0].dtype != p.dtype:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += nbytes
    return buckets


class OverlappedGradReducer:
    def __init__(self, params: list, dp_group: ProcessGroup, dp: int, bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        self.dp_group, self.dp = dp_group, dp
        self.buckets = [_Bucket(ps) for ps in make_buckets(params, bucket_bytes)]
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._count: dict[int, int] = {}
        self._accumulations = 0
        self._next = 0  # the next bucket to launch
        self.launched_in_backward = 0  # buckets of the last step whose all-reduce overlapped backward
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in params]

    def close(self) -> None:
        for h in self._handles:
            h.remove()

    def arm(self, accumulations: int) -> None:
        """Before a step whose gradients accumulate `accumulations` times (its micro-batches)."""
        self._accumulations, self._count, self._next = accumulations, {}, 0
        self.launched_in_backward = 0
        for b in self.buckets:
            b.ready, b.flat, b.work, b.grads = 0, None, None, []

    def _on_grad(self, p: torch.nn.Parameter) -> None:
        if not self._accumulations:
            return
        key = id(p)
        self._count[key] = self._count.get(key, 0) + 1
        if self._count[key] != self._accumulations:
            return
        align_grad_placement(p)
        self._bucket_of[key].ready += 1
        # Strictly in order; the last bucket waits for finish() (see the module docstring).
        while self._next < len(self.buckets) - 1 and self._complete(self.buckets[self._next]):
            self._launch(self.buckets[self._next])
            self._next += 1
            self.launched_in_backward += 1

    @staticmethod
    def _complete(bucket: _Bucket) -> bool:
        return bucket.ready == len(bucket.params)

    def _launch(self, bucket: _Bucket) -> None:
        for p in bucket.params:
            if p.grad is None:  # unused in this step: contributes zeros, as DDP's unused parameters
                p.grad = torch.zeros_like(p)
        bucket.grads = [local_grad(p) for p in bucket.params]
        # A copy (torch.cat always allocates; flattening one tensor would return a view of it):
        # the gradients stay this replica's until finish().
        bucket.flat = torch.cat([g.reshape(-1) for g in bucket.grads])
        bucket.work = dist.all_reduce(bucket.flat, group=self.dp_group, async_op=True)

    def finish(self) -> None:
        """Launch what is left, wait, and write the dp averages into the gradients."""
        for bucket in self.buckets[self._next :]:
            for p in bucket.params:
                align_grad_placement(p)
            self._launch(bucket)
        self._next = len(self.buckets)
        for bucket in self.buckets:
            bucket.work.wait()
            bucket.flat.div_(self.dp)
            for g, reduced in zip(bucket.grads, _unflatten_dense_tensors(bucket.flat, bucket.grads)):
                g.copy_(reduced)
            bucket.flat, bucket.work, bucket.grads = None, None, []
        self._accumulations = 0
