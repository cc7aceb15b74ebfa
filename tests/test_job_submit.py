"""`ray job submit` against a head started with `ray start --head` on loopback, as the README
describes: the job runs `copus run` on that cluster and writes its summary and MLflow run."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ray_job_submit_runs_copus_on_a_started_head(tmp_path, token_cache):
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("RAY_ADDRESS", None)
    dashboard = _free_port()
    # A short temp dir: Ray's unix sockets live under it, and socket paths are limited to ~107 bytes.
    ray_tmp = tempfile.mkdtemp(prefix="copus-rj-", dir="/tmp")
    log = open(tmp_path / "head.log", "w")
    # --block keeps the head in this child process: terminating it stops exactly this cluster
    # (not `ray stop`, which would stop every Ray on the machine). Every fixed port gets a free
    # one: another Ray (the other tests' local cluster) may hold the defaults, and a job agent
    # that cannot bind its port answers "No available agent".
    ports = [
        f"--{name}={_free_port()}"
        for name in (
            "port",
            "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port",
            "runtime-env-agent-port",
            "metrics-export-port",
            "ray-client-server-port",
        )
    ]
    head = subprocess.Popen(
        [
            str(bin_dir / "ray"),
            "start",
            "--head",
            "--block",
            "--num-cpus",
            "2",
            *ports,
            "--dashboard-host",
            "127.0.0.1",
            "--dashboard-port",
            str(dashboard),
            "--disable-usage-stats",
            "--temp-dir",
            ray_tmp,
        ],
        env=env,
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        address = f"http://127.0.0.1:{dashboard}"
        out = tmp_path / "job-out"
        cmd = [
            str(bin_dir / "ray"),
            "job",
            "submit",
            "--address",
            address,
            "--working-dir",
            ".",
            "--",
            "copus",
            "run",
            "experiments/quickstart.yaml",
            "--set",
            "workload.model=debug",
            "--set",
            "workload.seq_len=32",
            "--set",
            f"workload.dataset.cache_dir={token_cache}",
            "--set",
            "stop.max_steps=4",
            "--set",
            "stop.target_val_loss=null",
            "--set",
            "eval.every_steps=2",
            "--set",
            "eval.val_samples=8",
            "--set",
            "batch.gbs=8",
            "--set",
            "batch.mbs=2",
            "--set",
            "search.gbs_min=8",
            "--set",
            f"output_dir={out}",
            "--set",
            f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}",
        ]
        deadline = time.time() + 120
        not_ready = ("Connection", "No available agent", "try again later")
        while True:  # the dashboard's job API and its agent come up some seconds after the head
            proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
            output = proc.stdout + proc.stderr
            if proc.returncode == 0 or time.time() > deadline or not any(m in output for m in not_ready):
                break
            time.sleep(3)
        assert proc.returncode == 0, (
            proc.stdout[-2000:] + proc.stderr[-2000:] + "\nhead: " + (tmp_path / "head.log").read_text()[-2000:]
        )
        assert "succeeded" in proc.stdout
        # Exposure: the dashboard and its job API listen on loopback only, as the README says.
        listening = [
            c.laddr
            for c in psutil.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == dashboard
        ]
        assert listening and all(a.ip == "127.0.0.1" for a in listening), listening
        summary = json.loads((out / "summary.json").read_text())
        assert summary["steps"] == 4 and summary["stop_reason"] == "max_steps"
        assert (tmp_path / "mlflow.db").is_file()
    finally:
        _stop(head, ray_tmp)
        log.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _stop(head: subprocess.Popen, ray_tmp: str) -> None:
    """Stop exactly this cluster: the head and every process under it or started with its temp
    folder (Ray's daemons, the job's driver and workers). A SIGTERM to `ray start --block` alone
    stops it too, but its graceful shutdown took ~30 s here after a job had run, and after a
    SIGTERM to each process the daemons still ran 15 s later: SIGKILL, as `ray stop --force` does,
    on this cluster's processes only (its folder is removed next)."""
    cluster = [head_process := psutil.Process(head.pid), *head_process.children(recursive=True)]
    for p in psutil.process_iter(["cmdline"]):
        if any(ray_tmp in part for part in p.info["cmdline"] or ()) and p not in cluster:
            cluster.append(p)
    for p in cluster:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(cluster, timeout=30)
    head.wait(timeout=30)
