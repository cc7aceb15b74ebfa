"""RunMonitor: a small Ray actor that carries rank 0's metrics records to the driver.

Ray Train's own `report` is a barrier across workers (and costs seconds when called often),
so per-step metrics travel through this actor instead: rank 0 pushes fire-and-forget, the
driver drains in order and logs to MLflow. Only the driver and workers talk to it. It lives on
the driver's node (`on_driver_node`): placed on a worker node, it would die with that node and
take every record pushed after it with it.
"""

from __future__ import annotations

import uuid

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


class RecordQueue:
    """Records in arrival order; the driver keeps its own cursor. An actor restarted by Ray
    starts an empty queue under a new incarnation id, and a cursor of the old one starts over."""

    def __init__(self) -> None:
        self._records: list[dict] = []
        self.incarnation = uuid.uuid4().hex

    def push(self, record: dict) -> None:
        self._records.append(record)

    def drain(self, cursor: tuple[str | None, int]) -> tuple[tuple[str, int], list[dict]]:
        """Records after `cursor` (incarnation, index) and the cursor after them."""
        incarnation, start = cursor
        if incarnation != self.incarnation:
            start = 0
        out = self._records[start:]
        return (self.incarnation, start + len(out)), out


RunMonitor = ray.remote(num_cpus=0)(RecordQueue)


def on_driver_node() -> dict:
    """Actor options that place an actor on the node this driver runs on: the run's record
    queue and controller must outlive any worker node (a lost node is a fault the run recovers
    from; the driver's own node is the run itself)."""
    node = ray.get_runtime_context().get_node_id()
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node, soft=False)}
