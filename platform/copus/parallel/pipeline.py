"""Pipeline parallelism with torch.distributed.pipelining.

How a model is cut into stages is its family's (`ModelSpec.keep_stage`, workloads.registry).
`PipelineRunner` builds a PipelineStage and a GPipe or
1F1B schedule for the current (micro-batch size, micro-batch count), rebuilt only when those
change.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch
from torch import nn
from torch.distributed import ProcessGroup

# The schedules' class names in torch.distributed.pipelining. The module is imported when a stage
# is first built: it imports torch._dynamo (0.7 s of CPU), which a worker without a pipeline
# dimension (every data- and tensor-parallel run) never needs.
SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}


def _scaled(loss_fn: Callable, divisor: int, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return loss_fn(output, target) / divisor


class PipelineRunner:
    def __init__(
        self,
        module: nn.Module,
        stage: int,
        num_stages: int,
        device: torch.device,
        group: ProcessGroup,
        schedule: str,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ):
        if schedule not in SCHEDULES:
            raise ValueError(f"parallel.pp_schedule: unknown schedule {schedule!r} (known: {', '.join(SCHEDULES)})")
        self.module, self.stage, self.num_stages = module, stage, num_stages
        self.device, self.group, self.schedule_name, self.loss_fn = device, group, schedule, loss_fn
        self._key: tuple | None = None
        self._schedule = None

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1

    def _schedule_for(self, microbatch_size: int, microbatches: int, training: bool):
        key = (microbatch_size, microbatches, training)
        if key != self._key:
            from torch.distributed import pipelining

            pipe_stage = pipelining.PipelineStage(
                self.module, self.stage, self.num_stages, self.device, group=self.group
            )
            # Gradients of the batch's mean loss: each micro-batch's loss is divided by m before its
            # backward, as outside a pipeline, rather than the gradients after the last one
            # (scale_grads). So a gradient is final when its last backward ends, which the
            # data-parallel reducer (it starts all-reducing then) and the GNS probe rely on.
            scale = microbatches if training else 1
            self._schedule = getattr(pipelining, SCHEDULES[self.schedule_name])(
                pipe_stage,
                n_microbatches=microbatches,
                loss_fn=partial(_scaled, self.loss_fn, scale),
                scale_grads=False,
            )
            self._key = key
        return self._schedule

    def _run(
        self,
        inputs: torch.Tensor | None,
        targets: torch.Tensor | None,
        microbatch_size: int,
        microbatches: int,
        training: bool,
    ) -> torch.Tensor | None:
        """Returns the per-micro-batch losses (stacked) on the last stage, None elsewhere."""
        schedule = self._schedule_for(microbatch_size, microbatches, training)
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.is_first else ()
        kwargs = {"target": targets, "losses": losses} if self.is_last else {}
        if training:
            schedule.step(*args, return_outputs=False, **kwargs)
        else:
            schedule.eval(*args, **kwargs)
        scale = microbatches if training else 1
        return torch.stack([l.detach() * scale for l in losses]) if self.is_last else None

    def train_step(self, inputs, targets, microbatch_size: int, microbatches: int) -> torch.Tensor | None:
        return self._run(inputs, targets, microbatch_size, microbatches, training=True)

    @torch.no_grad()
    def eval_step(self, inputs, targets, microbatch_size: int, microbatches: int) -> torch.Tensor | None:
        return self._run(inputs, targets, microbatch_size, microbatches, training=False)
