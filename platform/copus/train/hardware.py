"""What a worker runs on, as plain data: the hardware half of a profile table's key, and the
device memory the memory model compares against. Runs on a worker node (the driver may have
no GPU)."""

from __future__ import annotations

import os
import platform

import torch

GIB = 1024 ** 3


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def describe_hardware(use_gpu: bool) -> dict:
    """Accelerator (or CPU) model, count and memory of this node. Memory is rounded to GiB so
    two machines of one kind get the same description."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    host = {"cpu": _cpu_model(), "cores": cores, "host_memory_gib": round(_host_memory_bytes() / GIB)}
    if use_gpu and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return {"kind": "cuda", "device": props.name, "devices_per_node": torch.cuda.device_count(),
                "device_memory_gib": round(props.total_memory / GIB), **host}
    return {"kind": "cpu", "device": host["cpu"], "devices_per_node": 1, "device_memory_gib": host["host_memory_gib"],
            **host}


def hardware_label(hw: dict) -> str:
    if hw["kind"] == "cuda":
        return f"{hw['devices_per_node']}x {hw['device']} ({hw['device_memory_gib']} GiB)"
    return f"CPU {hw['cpu']}, {hw['cores']} cores, {hw['host_memory_gib']} GiB"
