"""ParallelModel: one model replica under a (dp, tp, pp) layout, and the three things a step
needs from it: forward/backward over a replica's micro-batches, data-parallel gradient
averaging with clipping, and evaluation.

Construction: lay out the model on the meta device, cut it to this rank's pipeline stage,
allocate and initialise only that stage on the CPU (per-parameter seeding makes every rank's
part identical to the single-process model), shard it over the tp mesh (and, starting from a
Hugging Face model, fill each shard from its files), move it to the device, set its blocks'
activation recomputation, and, under sharded data parallelism, shard it over the dp mesh with
FSDP2. Every layout, (1,1,1) included, goes through this same code, which is what makes the
layouts comparable number for number.

Data parallelism (`dp_shard`): "none" keeps a whole replica per dp rank and all-reduces the
gradients in buckets that start during backward (copus.parallel.data_parallel); "optimizer"
and "full" shard the state with FSDP2 (copus.parallel.fsdp), which reduce-scatters the
gradients during the step's last backward. Either way the gradients accumulate over the
micro-batches without communication, and are reduced once per step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from copus.core.layout import DP_SHARD_MODES
from copus.parallel.data_parallel import DEFAULT_BUCKET_BYTES, OverlappedGradReducer
from copus.parallel.dims import ParallelDims
from copus.parallel.fsdp import apply_fsdp, reshard_all, set_microbatch_sync, unsharded_parameters
from copus.parallel.gns_probe import GradNormProbe, NormPair
from copus.parallel.grads import align_grad_placements, average_data_parallel_grads, clip_grads_, grad_sq_norm
from copus.parallel.pipeline import PipelineRunner
from copus.parallel.recompute import apply_recompute
from copus.parallel.tensor import apply_tp
from copus.train.weights import load_hf_weights
from workloads.flavours import ModelFlavour
from workloads.registry import ModelSpec, model_spec


def token_loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction=reduction)


@dataclass
class StepTiming:
    forward_backward_s: float = 0.0
    dp_allreduce_s: float = 0.0
    grad_norm_s: float = 0.0  # global norm (tp/pp collectives) and clipping


class ParallelModel:
    def __init__(
        self,
        flavour: ModelFlavour,
        seq_len: int,
        seed: int,
        dims: ParallelDims,
        device: torch.device,
        pp_schedule: str = "1f1b",
        autocast=None,
        initialize: bool = True,
        init_from: str | None = None,
        dp_shard: str = "none",
        recompute: str = "none",
        grad_bucket_bytes: int | None = DEFAULT_BUCKET_BYTES,
        spec: ModelSpec | None = None,
    ):
        """dp_shard: "none", "optimizer" or "full" (see the module docstring); with dp = 1 there
        is nothing to shard over and it is "none". recompute: "none", "selective" or "full"
        (copus.parallel.recompute). grad_bucket_bytes: bucket size of the overlapped gradient
        all-reduce under dp_shard "none"; None or 0 all-reduces everything after backward.
        spec: the model family that builds it (workloads.registry); default: the flavour's."""
        if dp_shard not in DP_SHARD_MODES:
            raise ValueError(f"parallel.dp_shard: unknown mode {dp_shard!r} (known: {', '.join(DP_SHARD_MODES)})")
        self.dims, self.device = dims, device
        self.spec = spec or model_spec(flavour.family)
        self.autocast_factory = autocast  # e.g. accelerator.autocast; None: full precision
        self.dp_shard = dp_shard if dims.dp > 1 else "none"
        self.recompute = recompute
        mesh = self._init_ranks(dims, device)
        model = self._build_stage(flavour, seq_len, seed, initialize, init_from, mesh)
        apply_recompute(model, recompute)
        if self.sharded:
            apply_fsdp(model, mesh["dp"], self.dp_shard)
        self.module: nn.Module = model
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self.pipeline = (
            PipelineRunner(self.module, self.pp_rank, dims.pp, device, self.pp_group, pp_schedule, token_loss)
            if dims.pp > 1
            else None
        )
        # Collectives for norms and losses only over dims that have more than one rank. A
        # replica's norm sums over tp and pp; the model's, under sharding, over dp too.
        self._replica_groups = [g for g, n in ((self.tp_group, dims.tp), (self.pp_group, dims.pp)) if n > 1]
        self._norm_groups = self._replica_groups + ([self.dp_group] if self.sharded else [])
        self.reducer = (
            OverlappedGradReducer(self.params, self.dp_group, dims.dp, grad_bucket_bytes)
            if dims.dp > 1 and not self.sharded and grad_bucket_bytes
            else None
        )
        self.timing = StepTiming()
        self.probe: GradNormProbe | None = None
        self.last_norms: NormPair | None = None  # the step's GNS measurement, when probing
        self._small: tuple[float, int] | None = None
        self._step_gbs = 0

    @property
    def sharded(self) -> bool:
        return self.dp_shard != "none"

    def _init_ranks(self, dims: ParallelDims, device: torch.device):
        """This rank's coordinates and groups in the layout; the mesh (None without a process group)."""
        if dist.is_available() and dist.is_initialized():
            mesh = dims.mesh(device.type)
            self.pp_rank = mesh.get_local_rank("pp")
            self.dp_rank = mesh.get_local_rank("dp")
            self.tp_rank = mesh.get_local_rank("tp")
            self.pp_group, self.dp_group = mesh.get_group("pp"), mesh.get_group("dp")
            self.tp_group = mesh.get_group("tp")
            return mesh
        if dims.world_size != 1:
            raise ValueError(f"layout {dims} needs a process group of {dims.world_size} ranks")
        self.pp_rank = self.dp_rank = self.tp_rank = 0
        self.pp_group = self.dp_group = self.tp_group = None
        return None

    def _build_stage(self, flavour, seq_len: int, seed: int, initialize: bool, init_from: str | None, mesh):
        """This rank's pipeline stage, allocated, initialised (or loaded) and tensor-parallel."""
        tp_mesh, spec = (mesh["tp"] if mesh is not None else None), self.spec
        model = spec.skeleton(flavour, seq_len)
        if self.dims.pp > 1:
            spec.keep_stage(model, self.pp_rank, self.dims.pp)
        if init_from is None:
            spec.materialize(model, seed, initialize)  # initialize=False: the caller fills in every value
            if self.dims.tp > 1:
                apply_tp(model, tp_mesh, spec.tp_plan(model))
        else:
            if spec.hf is None:
                raise ValueError(f"workload.init_from: the {spec.family!r} model family reads no Hugging Face weights")
            # Shard the skeleton first, then allocate: a rank holds only its shards, never its whole
            # stage, and fills them from the Hugging Face files (a box of each tensor).
            if self.dims.tp > 1:
                apply_tp(model, tp_mesh, spec.tp_plan(model))
            spec.materialize(model, seed, False)
            load_hf_weights(model, init_from, flavour, spec.hf)
        return model.to(self.device)

    def attach_probe(self, precondition=None) -> None:
        """Measure squared gradient norms at two batch sizes every step (for the GNS)."""
        self.probe = GradNormProbe(
            self.params,
            self.tp_rank,
            self._replica_groups,
            self.dp_group,
            self.dims.dp,
            precondition,
            use_hooks=self.pipeline is not None,
            # Sharded: a replica's gradient exists only on the whole parameters FSDP computes with.
            replica_params=unsharded_parameters(self.module) if self.sharded else None,
        )

    def detach_probe(self) -> None:
        if self.probe is not None:
            self.probe.close()
        self.probe, self._small, self.last_norms = None, None, None

    def close(self) -> None:
        """Let go of the layout: the probe's hooks and the mesh's process groups. Collective
        (every rank destroys the same groups); the model is unusable afterwards."""
        self.detach_probe()
        if self.reducer is not None:
            self.reducer.close()
        self.pipeline = None
        self.dims.release()

    def _autocast(self):
        return self.autocast_factory() if self.autocast_factory else torch.autocast(self.device.type, enabled=False)

    def _share_from_last_stage(self, value: torch.Tensor | None, like: torch.Size) -> torch.Tensor:
        """Pipeline losses exist on the last stage only: give every stage the same values."""
        if self.dims.pp == 1:
            return value
        out = value if value is not None else torch.zeros(like, device=self.device)
        dist.all_reduce(out, group=self.pp_group)  # the other stages contribute zeros
        return out

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor, mbs: int) -> torch.Tensor:
        """Accumulate gradients of the replica's mean loss over its m = len(inputs) / mbs
        micro-batches (each micro-batch's loss divided by m, in or out of a pipeline). Returns
        the per-micro-batch losses (same on every rank of the replica)."""
        t = time.perf_counter()
        m = inputs.shape[0] // mbs
        inputs, targets = inputs.to(self.device), targets.to(self.device)
        if self.probe is not None:
            self.probe.arm(m, grad_scale=m)
        if self.reducer is not None:
            self.reducer.arm(m)  # each gradient is final after m accumulations
        if self.pipeline is None:
            out = self._accumulate(inputs, targets, mbs, m)
        else:
            with self._autocast():
                out = self.pipeline.train_step(
                    inputs if self.pipeline.is_first else None, targets if self.pipeline.is_last else None, mbs, m
                )
            out = self._share_from_last_stage(out, torch.Size([m]))
        align_grad_placements(self.params)
        self._step_gbs = inputs.shape[0] * self.dims.dp
        self._small = self.probe.small_batch(self._step_gbs, mbs) if self.probe is not None else None
        self.timing.forward_backward_s = time.perf_counter() - t
        return out

    def _accumulate(self, inputs: torch.Tensor, targets: torch.Tensor, mbs: int, m: int) -> torch.Tensor:
        """Gradient accumulation outside a pipeline: m forward/backward passes."""
        losses = []
        for j in range(m):
            if self.sharded:
                set_microbatch_sync(self.module, last=j == m - 1, keep_unsharded=self.dp_shard == "optimizer")
            with self._autocast():
                loss = token_loss(self.module(inputs[j * mbs : (j + 1) * mbs]), targets[j * mbs : (j + 1) * mbs])
            (loss / m).backward()
            losses.append(loss.detach())
            if self.probe is not None and self.dims.dp == 1:
                self.probe.after_microbatch()
        return torch.stack(losses)

    def reduce_and_clip(self, grad_clip: float | None) -> float:
        """Average gradients over dp (finish the overlapped all-reduce; FSDP has reduce-scattered
        them already), then clip by the global norm. Returns the norm."""
        t = time.perf_counter()
        if self.reducer is not None:
            self.reducer.finish()
        elif not self.sharded:
            average_data_parallel_grads(self.params, self.dp_group, self.dims.dp)
        t2 = time.perf_counter()
        sq = grad_sq_norm(self.params, self.tp_rank, self._norm_groups)
        self.last_norms = None
        if self._small is not None:
            # The large-batch norm is the clipping norm, unless the GNS uses preconditioned gradients.
            sq_big = self.probe.large_batch() if self.probe.precondition is not None else float(sq)
            self.last_norms = NormPair(self._small[0], self._small[1], sq_big, self._step_gbs)
        norm = clip_grads_(self.params, grad_clip, sq) if grad_clip is not None else float(sq.sqrt())
        self.timing.dp_allreduce_s, self.timing.grad_norm_s = t2 - t, time.perf_counter() - t2
        return norm

    @torch.no_grad()
    def loss_sum(self, inputs: torch.Tensor, targets: torch.Tensor, chunk: int) -> torch.Tensor:
        """Sum of token losses over `inputs` in equal chunks (forward only; same on every rank of the replica)."""
        self.module.eval()
        m = inputs.shape[0] // chunk
        inputs, targets = inputs.to(self.device), targets.to(self.device)
        try:
            if self.pipeline is None:
                total = torch.zeros((), device=self.device)
                for j in range(m):
                    with self._autocast():
                        logits = self.module(inputs[j * chunk : (j + 1) * chunk])
                    total += token_loss(logits, targets[j * chunk : (j + 1) * chunk], reduction="sum")
                return total
            with self._autocast():
                means = self.pipeline.eval_step(
                    inputs if self.pipeline.is_first else None, targets if self.pipeline.is_last else None, chunk, m
                )
            means = self._share_from_last_stage(means, torch.Size([m]))
            return means.sum() * (chunk * targets.shape[1])
        finally:
            self.module.train()
            if self.sharded:
                reshard_all(self.module)
