"""The torch process group of a Ray Train worker group, set up by a backend whose controller side
never imports torch.

Ray Train's TorchConfig lives in `ray.train.torch`, whose import is torch's: the controller
actor unpickles the backend config a trainer hands it, so every worker group's controller
imported torch before it could start a worker, ~2.3 s on the critical path of each launch on 2
cores (measured with py-spy and a per-process CPU timeline), in a process that never touches a
tensor. This backend does the controller's part of Ray's (the backend's name, the master's
address, the order of the calls) and hands each worker Ray's own functions for the rest
(`ray.train.torch.config`: the env variables torchrun sets, NCCL's error handling,
`init_process_group`, the shutdown), imported on the worker, which has torch anyway. TPU set-up,
which Ray's backend also does, is left out: COPUS runs on CPUs and CUDA GPUs."""

from __future__ import annotations

import dataclasses
import logging
import os

import ray
from ray._private.ray_constants import env_integer
from ray.exceptions import GetTimeoutError
from ray.train._internal.utils import get_address_and_port
from ray.train.backend import Backend, BackendConfig
from ray.train.constants import DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S, TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S
from ray.train.v2._internal.util import TrainingFramework

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ProcessGroupConfig(BackendConfig):
    """Which torch.distributed backend the workers join ("gloo" or "nccl"), and its timeout."""

    backend: str = "gloo"
    timeout_s: int = 1800

    @property
    def backend_cls(self):
        return _ProcessGroupBackend

    @property
    def train_func_context(self):
        return _CudaDeviceContext

    @property
    def framework(self):
        return TrainingFramework.TORCH


class _CudaDeviceContext:
    """Around the train function on each worker: Ray's TorchConfigContextManager (the worker's
    own CUDA device made current), imported there."""

    def __enter__(self):
        from ray.train.torch.config import TorchConfigContextManager

        self._inner = TorchConfigContextManager()
        return self._inner.__enter__()

    def __exit__(self, *exc):
        return self._inner.__exit__(*exc)


class _ProcessGroupBackend(Backend):
    # As Ray's torch backend: the ranks of one node see all of its GPUs (NCCL's peer-to-peer
    # paths need them; each rank still picks its own device).
    share_cuda_visible_devices: bool = True

    def on_start(self, worker_group, backend_config: ProcessGroupConfig):
        addr, port = worker_group.execute_single(0, get_address_and_port)
        worker_group.execute(_set_distributed_env_vars, addr=addr, port=port)
        ray.get(
            [
                worker_group.execute_single_async(
                    rank,
                    _init_process_group,
                    backend=backend_config.backend,
                    world_rank=rank,
                    world_size=len(worker_group),
                    timeout_s=backend_config.timeout_s,
                )
                for rank in range(len(worker_group))
            ]
        )

    def on_shutdown(self, worker_group, backend_config: ProcessGroupConfig):
        futures = worker_group.execute_async(_shutdown, destroy_process_group=len(worker_group) > 1)
        timeout_s = env_integer(TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S, DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S)
        try:
            ray.get(futures, timeout=timeout_s)
        except GetTimeoutError:  # the workers are ended next, whatever their process group does
            logger.warning("torch process group shutdown timed out after %s s", timeout_s)


# On the workers:


def _set_distributed_env_vars(addr: str, port: int) -> None:
    """The env:// rendezvous's master, then the variables torchrun sets (Ray's function): one
    call to every worker where Ray's backend makes two."""
    from ray.train.torch.config import _set_torch_distributed_env_vars

    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)
    _set_torch_distributed_env_vars()


def _init_process_group(backend: str, world_rank: int, world_size: int, timeout_s: int) -> None:
    from ray.train.torch.config import _setup_torch_process_group

    _setup_torch_process_group(backend, world_rank, world_size, "env://", timeout_s)


def _shutdown(destroy_process_group: bool) -> None:
    from ray.train.torch.config import _shutdown_torch

    _shutdown_torch(destroy_process_group)
