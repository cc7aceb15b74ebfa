"""Squared gradient norms at two batch sizes, for the gradient noise scale, under 3D
parallelism.

Small batch:
- dp > 1: each replica's own gradient, before the data-parallel average (B_small = GBS / dp);
  the replicas' squared norms are averaged (each is an unbiased sample of E|g_{B_small}|²).
- dp = 1 with m >= 2 micro-batches: each micro-batch's own gradient (B_small = MBS), the m
  squared norms averaged. A post-accumulate-grad hook sees each parameter's accumulated
  gradient after every micro-batch; the micro-batch's gradient is the difference from the
  previous accumulation, so the probe keeps one copy of the (local) gradient during the step.
  Averaging all m micro-batches rather than taking the first matters: per-batch squared
  norms are heavy-tailed (a relative spread near 1 on the quickstart model). This works the
  same inside a pipeline schedule, whose backward passes run one micro-batch at a time.
Large batch: the data-parallel averaged gradient of the whole step (B_big = GBS).

Under sharded data parallelism (FSDP2) a replica's gradient never exists as the parameters'
`.grad`: FSDP accumulates it on the whole (unsharded) parameters it computes with and
reduce-scatters it at the end of the step's backward. The probe then reads it there: a
post-accumulate-grad hook on each whole parameter keeps the squared norm of its latest
accumulation, the replica's gradient once the last micro-batch is in (before FSDP takes it).
Only the dp > 1 small batch is needed (sharding with dp = 1 is plain training). Adam
preconditioning needs each parameter's whole AdamW state, which sharding splits over dp: the
probe refuses that combination.

Every squared norm sums tensor-parallel shards over tp (replicated parameters counted on one
tp rank only) and stages over pp, so it is the norm of the whole model's gradient.
Optionally each gradient is divided by Adam's sqrt(v_hat) + eps first (AdaptDL), using the
optimiser's state from the previous step (raw gradients before the first step).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup
from torch.distributed.tensor import DTensor

from copus.parallel.grads import Preconditioner, grad_sq_norm, is_tp_sharded, local_grad, sq_norm_local, sum_over


@dataclass(frozen=True)
class NormPair:
    sq_small: float
    b_small: int
    sq_big: float
    b_big: int


def adam_preconditioner(optimizer: torch.optim.Optimizer) -> Preconditioner:
    """sqrt(v_hat) + eps from AdamW's state for each parameter (None before its first step)."""
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}

    def divisor(p: torch.nn.Parameter) -> torch.Tensor | None:
        state = optimizer.state.get(p)
        if not state or "exp_avg_sq" not in state:
            return None
        group = group_of[id(p)]
        step = float(state["step"])
        v = state["exp_avg_sq"]
        v = v.to_local() if isinstance(v, DTensor) else v
        v_hat = v / (1 - group["betas"][1] ** step)
        return v_hat.sqrt().add_(group["eps"])

    return divisor


class GradNormProbe:
    def __init__(
        self,
        params: list[torch.nn.Parameter],
        tp_rank: int,
        norm_groups: list[ProcessGroup | None],
        dp_group: ProcessGroup | None,
        dp: int,
        precondition: Preconditioner | None = None,
        use_hooks: bool = True,
        replica_params: list[torch.nn.Parameter] | None = None,
    ):
        """use_hooks: find micro-batch boundaries with gradient hooks (needed inside a pipeline
        schedule); without, the caller calls after_microbatch() itself, which does the same
        work with a few multi-tensor (foreach) ops instead of several ops per parameter.
        replica_params: under sharded data parallelism, the whole parameters FSDP computes with
        (their gradients are the replica's own); `norm_groups` are then the replica's (tp, pp)."""
        if replica_params is not None and precondition is not None:
            raise ValueError(
                "gns.precondition: 'adam' needs each parameter's whole AdamW state, which "
                "parallel.dp_shard shards over dp; use gns.precondition 'none' or parallel.dp_shard 'none'"
            )
        self.params, self.tp_rank, self.norm_groups = params, tp_rank, norm_groups
        self.dp_group, self.dp = dp_group, dp
        self.precondition = precondition
        self._armed = False
        self._scale = 1.0
        self._microbatches = 1
        self._prev: dict[int, torch.Tensor] = {}  # accumulated local gradient after the last micro-batch
        self._count: dict[int, int] = {}  # micro-batches accumulated so far, per parameter (hooks)
        self._seen_microbatches = 0  # the same, with explicit boundaries
        self._sum_sq: torch.Tensor | None = None
        self._handles = []
        self._prev_buffers: list[torch.Tensor] | None = None
        self._replica_sq: dict[int, torch.Tensor] | None = None
        if replica_params is not None and dp > 1:
            self._replica_sq = {}
            self._handles = [p.register_post_accumulate_grad_hook(self._on_replica_grad) for p in replica_params]
        elif dp == 1 and use_hooks:  # micro-batch boundaries inside a pipeline schedule: hooks
            self._handles = [p.register_post_accumulate_grad_hook(self._on_accumulate) for p in params]

    def close(self) -> None:
        for h in self._handles:
            h.remove()

    # --- micro-batch path (dp = 1) ---
    def arm(self, microbatches: int, grad_scale: float) -> None:
        """Before a step of `microbatches` micro-batches whose gradients accumulate multiplied
        by 1 / grad_scale (m: the engine divides each micro-batch's loss by m, in a pipeline too)."""
        self._armed, self._scale, self._microbatches = True, grad_scale, microbatches
        self._prev, self._count, self._sum_sq, self._seen_microbatches = {}, {}, None, 0
        if self._replica_sq is not None:
            self._replica_sq = {}

    def _on_replica_grad(self, p: torch.nn.Parameter) -> None:
        """Sharded dp: the latest accumulation of a whole parameter's gradient (see the module
        docstring); the step's last one is the replica's gradient."""
        if self._armed:
            g = local_grad(p).detach()
            self._replica_sq[id(p)] = sq_norm_local([(g, is_tp_sharded(p.grad))], self.tp_rank).to(g.device)

    def _on_accumulate(self, p: torch.nn.Parameter) -> None:
        if not self._armed:
            return
        key = id(p)
        accumulated = local_grad(p).detach()
        prev = self._prev.get(key)
        micro = accumulated - prev if prev is not None else accumulated
        self._count[key] = self._count.get(key, 0) + 1
        if self._count[key] < self._microbatches:
            self._prev[key] = accumulated.clone()
        else:
            self._prev.pop(key, None)  # the last micro-batch: free the copy at once
        divisor = self.precondition(p) if self.precondition is not None else None
        micro = micro / divisor if divisor is not None else micro
        part = sq_norm_local([(micro * self._scale, is_tp_sharded(p.grad))], self.tp_rank).to(micro.device)
        self._sum_sq = part if self._sum_sq is None else self._sum_sq + part

    def after_microbatch(self) -> None:
        """Explicit micro-batch boundary (use_hooks=False): fold in the last micro-batch."""
        if not self._armed:
            return
        grads = [local_grad(p).detach() for p in self.params]
        if self._prev_buffers is None:  # kept across steps: no allocation per step
            self._prev_buffers = [torch.zeros_like(g) for g in grads]
        micro = grads if self._seen_microbatches == 0 else torch._foreach_sub(grads, self._prev_buffers)
        self._seen_microbatches += 1
        if self._seen_microbatches < self._microbatches:
            torch._foreach_copy_(self._prev_buffers, grads)
        if self.precondition is not None:
            divisors = [self.precondition(p) for p in self.params]
            micro = [m / d if d is not None else m for m, d in zip(micro, divisors)]
        norms = torch._foreach_norm(micro)
        # Embedding gradients arrive replicated before alignment: judge by the gradient's placement.
        keep = [n for n, p in zip(norms, self.params) if is_tp_sharded(p.grad) or self.tp_rank == 0]
        part = torch.stack(keep).float().pow(2).sum() * self._scale**2 if keep else torch.zeros(())
        self._sum_sq = part if self._sum_sq is None else self._sum_sq + part

    def _disarm(self) -> torch.Tensor:
        """Mean over the step's micro-batches of their squared gradient norms."""
        self._armed = False
        self._prev, self._count = {}, {}
        sq = self._sum_sq if self._sum_sq is not None else torch.zeros(())
        return sum_over(sq, self.norm_groups) / self._microbatches

    # --- per step ---
    def small_batch(self, gbs: int, mbs: int) -> tuple[float, int] | None:
        """Call after the micro-batches, before the data-parallel average."""
        if self.dp > 1:
            if self._replica_sq is not None:
                self._armed = False
                sq = sum_over(torch.stack(list(self._replica_sq.values())).sum(), self.norm_groups)
            else:
                sq = grad_sq_norm(self.params, self.tp_rank, self.norm_groups, self.precondition)
            dist.all_reduce(sq, group=self.dp_group)
            return float(sq) / self.dp, gbs // self.dp
        sq = self._disarm()
        if gbs // mbs < 2:
            return None  # one micro-batch, one replica: no smaller batch to compare with
        return float(sq), mbs

    def large_batch(self) -> float:
        """Call after the data-parallel average, before clipping."""
        return float(grad_sq_norm(self.params, self.tp_rank, self.norm_groups, self.precondition))
