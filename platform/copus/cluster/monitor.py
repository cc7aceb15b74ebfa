"""RunMonitor: a small Ray actor that carries rank 0's metrics records to the driver.

Ray Train's own `report` is a barrier across workers (and costs seconds when called often),
so per-step metrics travel through this actor instead: rank 0 pushes fire-and-forget, the
driver drains in order and logs to MLflow. Only the driver and workers talk to it.
"""

from __future__ import annotations

import ray


class RecordQueue:
    """Records in arrival order; the driver keeps its own cursor."""

    def __init__(self) -> None:
        self._records: list[dict] = []

    def push(self, record: dict) -> None:
        self._records.append(record)

    def drain(self, start: int) -> list[dict]:
        """Records from index `start` on."""
        return self._records[start:]


RunMonitor = ray.remote(num_cpus=0)(RecordQueue)
