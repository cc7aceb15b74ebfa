"""GPU check of the worker-side training path: CUDA device via accelerate, an NCCL process
group and a CUDA DeviceMesh, bf16 autocast, the GNS probe, DCP checkpoint and exact resume on
the GPU (one GPU: layout (1,1,1)).

Runs without Ray or MLflow (the worker loop does not import them), so it works on a bare GPU
machine with torch and accelerate:

    PYTHONPATH=platform:. python bench/gpu_check.py

Prints one JSON object per check. Figures are measured in this run only.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "platform"), str(Path(__file__).resolve().parents[1])]

from copus.core.layout import CandidateConfig  # noqa: E402
from copus.core.schedule import LRSchedule  # noqa: E402
from copus.train.local import run_local  # noqa: E402
from copus.train.plan import StopRule, WorkerPlan  # noqa: E402
from workloads.corpus import prepare_dataset  # noqa: E402


def _run(plan: WorkerPlan, ckpt: Path, resume: int | None = None) -> tuple[list[dict], dict, float]:
    t = time.perf_counter()
    records, final, _ = run_local(plan, ckpt, resume)
    return records, final, time.perf_counter() - t


def main() -> None:
    assert torch.cuda.is_available(), "no CUDA device"
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29533",
            "RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
        }
    )
    dist.init_process_group("nccl", rank=0, world_size=1)
    files = prepare_dataset("stdlib", None, None, "text", "uint16", 0.01, 256, tempfile.mkdtemp())
    base = WorkerPlan(
        model="tiny",
        seq_len=128,
        seed=0,
        train_tokens=str(files.train),
        val_tokens=str(files.val),
        token_dtype=files.dtype,
        config=CandidateConfig(dp=1, tp=1, pp=1, mbs=16, gbs=64),
        lr=LRSchedule(3e-3, 16, warmup_samples=1280),
        stop=StopRule(max_steps=300),
        eval_every_steps=100,
        val_samples=256,
        checkpoint_every_steps=1000,
        use_gpu=True,
        mixed_precision="bf16",
    )
    print(
        json.dumps(
            {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "backend": dist.get_backend()}
        ),
        flush=True,
    )

    for name, plan in (
        ("tiny-bf16", base),
        ("tiny-fp32", replace(base, mixed_precision="no")),
        ("small-bf16-seq512", replace(base, model="small", seq_len=512, val_samples=128, stop=StopRule(max_steps=100))),
    ):
        records, final, seconds = _run(plan, Path(tempfile.mkdtemp()))
        steps = [r for r in records if r["kind"] == "step"]
        rates = sorted(r["samples_per_s"] for r in steps[len(steps) // 2 :])
        vals = [r["val_loss"] for r in records if r["kind"] == "eval"]
        print(
            json.dumps(
                {
                    "check": name,
                    "steps": final["step"],
                    "val_loss_first": vals[0],
                    "val_loss_last": vals[-1],
                    "median_samples_per_s": rates[len(rates) // 2],
                    "seconds": round(seconds, 1),
                    "b_noise": steps[-1].get("b_noise"),
                    "statistical_efficiency": steps[-1].get("statistical_efficiency"),
                }
            ),
            flush=True,
        )

    # Exact resume on the GPU: 6 steps in one go versus 3 + resume to 6.
    plan = replace(base, stop=StopRule(max_steps=6), checkpoint_every_steps=3, eval_every_steps=3)
    ref, _, _ = _run(plan, Path(tempfile.mkdtemp()))
    cut = Path(tempfile.mkdtemp())
    _run(replace(plan, stop=StopRule(max_steps=3)), cut)
    res, final, _ = _run(plan, cut, resume=3)
    ref_loss = {r["step"]: r["train_loss"] for r in ref if r["kind"] == "step"}
    res_loss = {r["step"]: r["train_loss"] for r in res if r["kind"] == "step"}
    worst = max(abs(res_loss[s] - ref_loss[s]) / abs(ref_loss[s]) for s in res_loss)
    print(
        json.dumps(
            {
                "check": "resume-bf16",
                "resumed_steps": sorted(res_loss),
                "max_rel_loss_diff": worst,
                "samples": final["samples"],
            }
        ),
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
