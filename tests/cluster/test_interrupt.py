"""Ctrl-C in `copus run`: one line saying where it stopped and how to go on, exit 130, and the
same command resumes from the kept checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

pytestmark = pytest.mark.slow


def test_ctrl_c_in_copus_run_prints_one_line_and_exits_130(base_mapping, tmp_path):
    base_mapping["stop"] = {"max_steps": 100000}
    base_mapping["checkpoint"] = {"every_steps": 2}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(base_mapping))
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "copus.cli", "run", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.time() + 240
    records = out / "records.jsonl"
    # Wait for a checkpoint to exist, then press Ctrl-C.
    while time.time() < deadline and proc.poll() is None:
        if records.is_file() and '"kind": "checkpoint"' in records.read_text():
            break
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    lines = [line for line in err.splitlines() if line.startswith("copus:")]
    assert len(lines) == 1 and lines[0].startswith("copus: interrupted; the checkpoint of step"), err
    assert "Traceback" not in err
    steps = [json.loads(line)["step"] for line in records.read_text().splitlines() if '"kind": "checkpoint"' in line]
    assert f"step {steps[-1]}" in lines[0] or f"step {steps[-2]}" in lines[0]
