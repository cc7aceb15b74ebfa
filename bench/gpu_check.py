"""GPU check of the worker-side training path: CUDA device via accelerate, an NCCL process
group and a CUDA DeviceMesh, bf16 autocast, the GNS probe, DCP checkpoint and exact resume on
the GPU (one GPU: layout (1,1,1)).

Runs without Ray or MLflow (the worker loop does not import them), so it works on a bare GPU
machine with torch and accelerate:

    PYTHONPATH=platform:. python bench/gpu_check.py
    PYTHONPATH=platform:. python bench/gpu_check.py --smoke   # a few steps each; on the CPU (gloo) without a GPU

Prints one JSON object per check; the last is the resume check,
`{"check": "resume-bf16", "resumed_steps": [...], "max_rel_loss_diff": X, "samples": N}`
(`resume-fp32` where there is no GPU, as in smoke mode on a CPU). Figures are measured in this run only.
Exits 1, saying why, when the resume does not reproduce the uninterrupted run's steps 4-6 (their
training losses within a relative RESUME_TOLERANCE, its samples the same).
"""

from __future__ import annotations

import argparse
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

from smoke import parse_args  # noqa: E402

from copus.core.layout import CandidateConfig  # noqa: E402
from copus.core.schedule import LRSchedule  # noqa: E402
from copus.train.local import run_local  # noqa: E402
from copus.train.worker_plan import StopRule, WorkerPlan  # noqa: E402
from workloads.datasets import prepare_dataset  # noqa: E402

# How far a resumed step's training loss may lie from the uninterrupted run's, relative: the
# tolerance of the CPU test of exact resume (tests/train/test_loop.py); on an H200 in bf16 it was 0.
RESUME_TOLERANCE = 1e-6


def _run(plan: WorkerPlan, ckpt: Path, resume: int | None = None) -> tuple[list[dict], dict, float]:
    t = time.perf_counter()
    records, final, _ = run_local(plan, ckpt, resume)
    return records, final, time.perf_counter() - t


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="steps of each training check")
    parser.add_argument("--gbs", type=int, default=64)
    args = parse_args(parser, {"steps": 4, "gbs": 8}, argv)
    gpu = torch.cuda.is_available()
    if not gpu and not args.smoke:
        raise SystemExit("bench/gpu_check.py: no CUDA device (--smoke runs the same checks on the CPU)")
    os.environ.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    store = Path(tempfile.mkdtemp(prefix="copus-gpu-check-")) / "store"  # no fixed port to collide on
    dist.init_process_group("nccl" if gpu else "gloo", init_method=f"file://{store}", rank=0, world_size=1)
    files = prepare_dataset("stdlib", None, None, "text", "uint16", 0.01, 256, tempfile.mkdtemp())
    base = _base_plan(files, args.steps, args.gbs, gpu)
    print(
        json.dumps(
            {
                "device": torch.cuda.get_device_name(0) if gpu else "cpu",
                "torch": torch.__version__,
                "backend": dist.get_backend(),
            }
        ),
        flush=True,
    )
    _training_checks(base, args.steps)
    _resume_check(base)
    dist.destroy_process_group()


def _base_plan(files, steps: int, gbs: int, gpu: bool) -> WorkerPlan:
    return WorkerPlan(
        model="tiny",
        seq_len=128,
        seed=0,
        train_tokens=str(files.train),
        val_tokens=str(files.val),
        token_dtype=files.dtype,
        config=CandidateConfig(dp=1, tp=1, pp=1, mbs=min(16, gbs), gbs=gbs),
        lr=LRSchedule(3e-3, 16, warmup_samples=1280),
        stop=StopRule(max_steps=steps),
        eval_every_steps=max(1, steps // 3),
        val_samples=256 if gpu else 16,
        checkpoint_every_steps=1000,
        use_gpu=gpu,
        mixed_precision="bf16" if gpu else "no",
    )


def _precision(plan: WorkerPlan) -> str:
    return "bf16" if plan.mixed_precision == "bf16" else "fp32"


def _training_checks(base: WorkerPlan, steps: int) -> None:
    for name, plan in (
        (f"tiny-{_precision(base)}", base),
        ("tiny-fp32", replace(base, mixed_precision="no")),
        (
            f"small-{_precision(base)}-seq512",
            replace(
                base,
                model="small",
                seq_len=512,
                val_samples=min(128, base.val_samples),
                stop=StopRule(max_steps=max(1, steps // 3)),
            ),
        ),
    ):
        records, final, seconds = _run(plan, Path(tempfile.mkdtemp()))
        step_records = [r for r in records if r["kind"] == "step"]
        rates = sorted(r["samples_per_s"] for r in step_records[len(step_records) // 2 :])
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
                    "b_noise": step_records[-1].get("b_noise"),
                    "statistical_efficiency": step_records[-1].get("statistical_efficiency"),
                }
            ),
            flush=True,
        )


def _resume_check(base: WorkerPlan) -> None:
    """Exact resume on the device: 6 steps in one go versus 3 + resume to 6."""
    plan = replace(base, stop=StopRule(max_steps=6), checkpoint_every_steps=3, eval_every_steps=3)
    ref, ref_final, _ = _run(plan, Path(tempfile.mkdtemp()))
    cut = Path(tempfile.mkdtemp())
    _run(replace(plan, stop=StopRule(max_steps=3)), cut)
    res, final, _ = _run(plan, cut, resume=3)
    ref_loss = {r["step"]: r["train_loss"] for r in ref if r["kind"] == "step"}
    res_loss = {r["step"]: r["train_loss"] for r in res if r["kind"] == "step"}
    diffs = relative_loss_diffs(ref_loss, res_loss)
    print(
        json.dumps(
            {
                "check": f"resume-{_precision(base)}",
                "resumed_steps": sorted(res_loss),
                "max_rel_loss_diff": max(diffs.values(), default=None),
                "samples": final["samples"],
            }
        ),
        flush=True,
    )
    problem = resume_problem(ref_loss, res_loss, ref_final["samples"], final["samples"])
    if problem is not None:
        raise SystemExit(f"bench/gpu_check.py: the resume did not reproduce the run: {problem}")


def relative_loss_diffs(ref_loss: dict[int, float], res_loss: dict[int, float]) -> dict[int, float]:
    """|resumed − uninterrupted| / |uninterrupted| training loss, at each step both ran."""
    return {s: abs(res_loss[s] - ref_loss[s]) / abs(ref_loss[s]) for s in sorted(res_loss) if s in ref_loss}


def resume_problem(
    ref_loss: dict[int, float], res_loss: dict[int, float], ref_samples: int, res_samples: int
) -> str | None:
    """Why a run resumed from its step-3 checkpoint is not the uninterrupted run (training loss
    by step, and the samples each ended at), or None when it is: steps 4-6 and no others, each
    loss within RESUME_TOLERANCE of the uninterrupted run's, the same samples."""
    if sorted(res_loss) != [4, 5, 6] or not {4, 5, 6} <= set(ref_loss):
        return f"resumed steps {sorted(res_loss)}, uninterrupted {sorted(ref_loss)}: not both steps 4-6"
    diffs = relative_loss_diffs(ref_loss, res_loss)
    off = [s for s in sorted(diffs) if not diffs[s] <= RESUME_TOLERANCE]  # NaN included
    if off:
        step = off[0]
        return (
            f"step {step}'s training loss {res_loss[step]} against {ref_loss[step]} "
            f"(relative difference {diffs[step]:.3g} > {RESUME_TOLERANCE:g})"
        )
    if res_samples != ref_samples:
        return f"{res_samples} samples at the end, against {ref_samples}"
    return None


if __name__ == "__main__":
    main()
