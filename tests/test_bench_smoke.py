"""Every script in bench/ still runs: each in its smoke mode (`--smoke`: smallest sizes, one
round), as a user runs it from the repository root, must exit 0 and end with its documented
last line (docs/benchmarks.md). Figures are not checked: smoke sizes measure nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

NUMBER = r"[-+]?\d+(\.\d+)?"
# Each script's documented last line (a public interface: other people's scripts read it).
LAST_LINES = {
    "calibration_seeds.py": rf"seeds \d+: B_crit within x{NUMBER} of all seeds' in {NUMBER}%, intervals hold it in "
    rf"{NUMBER}% \(worst branch point\)",
    "faults.py": rf"time lost to one controller kill: ({NUMBER} s \({NUMBER}% of the clean run\)|n/a .*)",
    "gns_overhead.py": rf"worst probe overhead: {NUMBER}%",
    "gpu_check.py": r'\{"check": "resume-(bf16|fp32)", "resumed_steps": \[.*\], "max_rel_loss_diff": .*\}',
    "hf_load.py": rf"layout dp\d+-tp\d+-pp\d+: per rank held {NUMBER} MB \(= bytes read\), peak RSS growth .*",
    "link_rate.py": rf"configured {NUMBER} Mbit/s: achieved {NUMBER} Mbit/s \(x{NUMBER}\); dp all-reduce/compute "
    rf"({NUMBER}|n/a) at GBS \d+",
    "horizon.py": rf"horizon/left x{NUMBER} \(p10 x{NUMBER}, p90 x{NUMBER}\) over \d+ readings of \d+ runs; the latest 8 "
    rf"evaluations x{NUMBER} \(p10 x{NUMBER}, p90 x{NUMBER}\)",
    "layouts.py": rf"best of \d+ workers: dp\d+ tp\d+ pp\d+.* gbs \d+ mbs \d+: {NUMBER} samples/s",
    "memory.py": r'\{"rows": \[\{"setting": .*\}\]\}',
    "noise_outliers.py": rf"outliers: largest one-step jump x{NUMBER} plain, x{NUMBER} weighted \(median over runs "
    rf"x{NUMBER}, x{NUMBER}\); weighted/plain x{NUMBER} \(runs x{NUMBER}-x{NUMBER}\); \d+ of \d+ steps weighted down, \d+ runs",
    "noise_tracking.py": rf"tracking: progress x({NUMBER}|nan), fixed x({NUMBER}|nan)",
    "planner.py": rf"enumerate \+ score \+ decide from scratch: {NUMBER} ms",
    "pool_suites.py": rf"pooled \d+ seeds: \S+ reaches ({NUMBER}%|n/a) of \S+'s gain over \S+ "
    rf"\((95% interval {NUMBER}% to {NUMBER}%|95% interval (from|up to) {NUMBER}%, unbounded (above|below): .*"
    r"|no 95% interval, unbounded below and above: .*|no share: .*|no interval: .*)\)",
    "prepare.py": r"same token files: True",
    "profile_timing.py": rf"continuous/run x{NUMBER} \({NUMBER}-{NUMBER}\), barrier/run x{NUMBER} \({NUMBER}-{NUMBER}\) "
    r"over \d+ configurations",
    "reconfigure.py": rf"restart/in-place downtime ratio: {NUMBER}",
    "reshard.py": rf"\d+ ranks: in place {NUMBER} s .*, through DCP on disk {NUMBER} s: {NUMBER}x",
    "simulate.py": rf"full simulated comparison: {NUMBER} s wall-clock",
    "sim_sweep.py": rf"sweep \S+ over \d+ values: copus vs best user-tuned ({NUMBER}% to {NUMBER}%|n/a), vs "
    rf"hindsight-tuned ({NUMBER}% to {NUMBER}%|n/a), ceiling over hindsight-tuned ({NUMBER}% to {NUMBER}%|n/a)",
}
RAY_SCRIPTS = {
    "faults.py",
    "reconfigure.py",
    "link_rate.py",
    "profile_timing.py",
}  # a Ray cluster (local, or emulated) each
NEEDS_ROOT = {"link_rate.py"}  # an emulated cluster: namespaces, tc, cpusets


def test_every_bench_script_has_a_smoke_case():
    assert sorted(LAST_LINES) == sorted(p.name for p in (REPO / "bench").glob("*.py") if p.name != "smoke.py")


@pytest.mark.parametrize(
    "script",
    [pytest.param(s, marks=pytest.mark.slow) if s in RAY_SCRIPTS else s for s in sorted(LAST_LINES)],
)
def test_bench_script_runs_and_prints_its_last_line(script, tmp_path):
    if script in NEEDS_ROOT:
        from copus.cluster.emulate import requirements_problem

        if requirements_problem():
            pytest.skip(requirements_problem())
    env = dict(os.environ)  # with tests/conftest.py's Ray Train settings
    # Whatever a script leaves behind goes with the test; not for the Ray scripts: Ray puts its
    # sockets under TMPDIR, whose path must stay short.
    if script not in RAY_SCRIPTS:
        env["TMPDIR"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, str(Path("bench") / script), "--smoke"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(LAST_LINES[script], last), last


def test_gpu_check_fails_when_a_resume_does_not_reproduce_its_steps(monkeypatch):
    """bench/gpu_check.py exits non-zero unless the resumed steps 4-6 are the uninterrupted run's
    (its smoke case above, exit 0, therefore says the resume reproduced them on the CPU)."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    from gpu_check import RESUME_TOLERANCE, resume_problem

    ref = {1: 5.0, 2: 4.8, 3: 4.6, 4: 4.5, 5: 4.4, 6: 4.3}
    same = {s: ref[s] for s in (4, 5, 6)}
    assert resume_problem(ref, same, 48, 48) is None
    assert resume_problem(ref, {**same, 5: 4.4 * (1 + RESUME_TOLERANCE / 2)}, 48, 48) is None
    assert "step 5's training loss" in resume_problem(ref, {**same, 5: 4.41}, 48, 48)
    assert "step 6's" in resume_problem(ref, {**same, 6: float("nan")}, 48, 48)
    assert "not both steps 4-6" in resume_problem(ref, {4: 4.5, 5: 4.4}, 48, 48)  # a step lost
    assert "not both steps 4-6" in resume_problem(ref, {**same, 3: 4.6}, 48, 48)  # resumed too early
    assert resume_problem(ref, same, 48, 40) == "40 samples at the end, against 48"
