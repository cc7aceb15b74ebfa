"""What a Ray Train worker group is handed as its train_loop_config: a reference to the
workers' config in the object store, opened by the workers alone.

Ray Train copies train_loop_config into the run context that its controller actor (and its
callbacks) unpickle. A config holding copus classes (a launch, a worker plan, a profiling job)
would import their modules there, torch and the whole training stack with them: about 2.7 CPU-s
of every run on 2 cores (profiled with py-spy), in a process that never trains. An ObjectRef
unpickles without importing anything."""

from __future__ import annotations

import ray

_KEY = "sealed"


def sealed(config: dict) -> dict:
    """`config` in the object store, as the train_loop_config to hand Ray Train."""
    return {_KEY: ray.put(config)}


def opened(loop_config: dict) -> dict:
    """On a worker: the config `sealed` put in the object store."""
    return ray.get(loop_config[_KEY])
