"""The emulated cluster's inter-node link: achieved against configured bandwidth, the
data-parallel all-reduce across it, and the link rate at which the emulated cluster's ratio of
all-reduce time to compute time per step matches the paper's clusters.

For each rate of the sweep (the experiment's cluster.emulate.link_mbit times 1/4, 1/2, 1, 2, 4;
the links are re-capped in place):
- TCP: one stream from node 1 to node 2 (a socket pair, 8 MB a round): achieved Mbit/s;
- all-reduce: the experiment's workers (ranks per node as `copus run` places them), gloo, a
  tensor of the model's gradient bytes (fp32), the median of 5 rounds.
Then, once, the compute time per step of the all-data-parallel layout at the reference GBS
(optimizer.reference_gbs): `copus profile` of that one configuration with the links uncapped
(100 Gbit/s), less its all-reduce there. The ratio at each rate is all-reduce / compute, the
same ratio `copus.core.simulator.dp_allreduce_ratio` gives for the paper settings (simulated
datasheets, the all-data-parallel layout at their reference GBS 256 and at the smallest GBS
their world size allows): the rate where the two are equal is printed per setting.

    .venv/bin/python bench/link_rate.py experiments/emulated_2node.yaml   # about 3 minutes; root
    .venv/bin/python bench/link_rate.py --smoke                           # one rate, 2 rounds

Needs root (an emulated cluster: docs/emulated-cluster.md); it brings one up and takes it down
unless one of the experiment's description is up already (then it restores its rate). The last
line reads `configured R Mbit/s: achieved A Mbit/s (xF); dp all-reduce/compute X at GBS G`.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from smoke import parse_args

REPO = Path(__file__).resolve().parent.parent
TCP_BYTES = 8 * 1024**2
TCP_PORT, GLOO_PORT = 29710, 29711
UNCAPPED_MBIT = 100_000.0


def tcp_server(port: int, nbytes: int) -> None:
    with socket.create_server(("0.0.0.0", port)) as server:
        conn, _ = server.accept()
        with conn:
            got = 0
            while got < nbytes:
                chunk = conn.recv(1 << 20)
                if not chunk:
                    break
                got += len(chunk)
            conn.sendall(b"k")


def tcp_client(host: str, port: int, nbytes: int) -> None:
    """Send nbytes, wait for the server's acknowledgement, print the achieved Mbit/s."""
    payload = b"\0" * (1 << 20)
    for _ in range(50):  # the server may not listen yet
        try:
            conn = socket.create_connection((host, port), timeout=30)
            break
        except OSError:
            time.sleep(0.1)
    with conn:
        t0 = time.perf_counter()
        for _ in range(nbytes // len(payload)):
            conn.sendall(payload)
        conn.recv(1)
        print(nbytes * 8 / 1e6 / (time.perf_counter() - t0))


def allreduce(rank: int, world: int, master: str, port: int, numel: int, rounds: int) -> None:
    """One gloo rank: all-reduce a float32 tensor of `numel` elements; rank 0 prints the median s."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=world)
    x = torch.ones(numel)
    dist.all_reduce(x)  # connections up before timing
    times = []
    for _ in range(rounds):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        print(statistics.median(times))
    dist.destroy_process_group()


def _worker(argv: list[str]) -> None:
    kind, rest = argv[0], argv[1:]
    if kind == "tcp-server":
        tcp_server(int(rest[0]), int(rest[1]))
    elif kind == "tcp-client":
        tcp_client(rest[0], int(rest[1]), int(rest[2]))
    else:
        allreduce(*(int(rest[0]), int(rest[1]), rest[2], int(rest[3]), int(rest[4]), int(rest[5])))


def measure_tcp(emulate, state: dict) -> float:
    me = [sys.executable, str(Path(__file__).resolve()), "--worker"]
    server = emulate.node_popen(2, [*me, "tcp-server", str(TCP_PORT), str(TCP_BYTES)])
    client = emulate.node_popen(
        1,
        [*me, "tcp-client", state["nodes"][1]["ip"], str(TCP_PORT), str(TCP_BYTES)],
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = client.communicate(timeout=300)
    server.wait(timeout=60)
    return float(out.strip().splitlines()[-1])


def measure_allreduce(emulate, state: dict, per_node: int, numel: int, rounds: int) -> float:
    """Ranks placed node by node, as Ray Train numbers them; GLOO_SOCKET_IFNAME as on the nodes."""
    world = per_node * len(state["nodes"])
    master = state["nodes"][0]["ip"]
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": emulate.NODE_IFNAME,
        "OMP_NUM_THREADS": "1",
        "TORCH_CPP_LOG_LEVEL": "ERROR",
    }
    procs = []
    for rank in range(world):
        argv = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            "allreduce",
            str(rank),
            str(world),
            master,
            str(GLOO_PORT),
        ]
        procs.append(
            emulate.node_popen(
                rank // per_node + 1, [*argv, str(numel), str(rounds)], env=env, stdout=subprocess.PIPE, text=True
            )
        )
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"an all-reduce rank failed: exit codes {[p.returncode for p in procs]}")
    return float(outs[0].strip().splitlines()[-1])


def compute_time(experiment: str, cfg, allreduce_uncapped_s: float) -> float:
    """The all-data-parallel layout's step at the reference GBS (links uncapped), less its all-reduce."""
    from copus.cluster.emulate_link import reference_shape
    from copus.core.tuning import layout_overrides

    world, (_, _, per_rank) = cfg.cluster.num_workers, reference_shape(cfg)
    gbs = per_rank * world
    sets = [
        f"cluster.emulate.link_mbit={UNCAPPED_MBIT}",
        "cluster.emulate.compute_reference_s=null",  # uncapped on every machine
        f"search.layouts=[[{world},1,1]]",
        f"search.gbs_min={gbs}",
        f"search.gbs_max={2 * gbs}",
        f"search.mbs=[{per_rank}]",
        f"batch.gbs={gbs}",
        f"batch.mbs={per_rank}",
        *layout_overrides((world, 1, 1)),
        "profile.budget_s=120",
        "tracking.experiment=link-rate-bench",
    ]
    with tempfile.TemporaryDirectory(prefix="copus-link-") as out:
        cmd = [sys.executable, "-m", "copus.cli", "profile", experiment, "--json", f"--set=output_dir={out}"]
        cmd += [f"--set={s}" for s in sets]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
        if done.returncode != 0:
            raise SystemExit(f"copus profile failed: {done.stderr.strip().splitlines()[-1:]}")
        table = json.loads(Path(json.loads(done.stdout)["table"]).read_text())
    # Two points (the step-time model needs two): the reference GBS and its double.
    step = min(r["step_time_s"] for r in table["rows"] if r["status"] == "ok" and r["gbs"] == gbs)
    return max(step - allreduce_uncapped_s, 1e-9)


def paper_ratios() -> list[tuple[str, int, float]]:
    """(setting, GBS, ratio) for every multi-node paper setting, at GBS 256 and at its world size."""
    from copus.core.simulator import dp_allreduce_ratio
    from copus.sim.config import load_sim_config, setting_from

    rows = []
    for path in sorted(glob.glob(str(REPO / "experiments/sim/paper_*.yaml"))):
        s = setting_from(load_sim_config(path))
        if s.cluster.nodes < 2:
            continue
        for gbs in (s.cluster.world, 256):
            rows.append(
                (Path(path).stem.removeprefix("paper_"), gbs, dp_allreduce_ratio(s.cluster, s.shape, s.seq_len, gbs))
            )
    return rows


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", nargs="?", default="experiments/emulated_2node.yaml")
    parser.add_argument("--factors", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0, 4.0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-compute", action="store_true", help="skip the compute measurement (no ratio)")
    args = parse_args(parser, {"factors": [1.0], "rounds": 2, "no_compute": True})
    run(args)


def run(args) -> None:
    from copus.cluster import emulate
    from copus.config import load_config

    problem = emulate.requirements_problem()
    if problem:
        raise SystemExit(f"link_rate: {problem}")
    cfg = load_config(args.experiment)
    spec = emulate.EmulatedSpec.from_config(cfg)
    numel = cfg.flavour().param_count()
    print(f"{spec.describe()}; gradient {numel * 4 / 1e6:.2f} MB (fp32), {spec.workers_per_node} ranks per node")
    with emulate.emulated_cluster(spec) as state:
        try:
            rows = sweep(emulate, state, spec, args, numel)
            compute = None
            if not args.no_compute:
                emulate.reshape(spec.state_dir, UNCAPPED_MBIT)
                uncapped = measure_allreduce(emulate, state, spec.workers_per_node, numel, args.rounds)
                compute = compute_time(args.experiment, cfg, uncapped)
        finally:
            emulate.reshape(spec.state_dir, spec.link_mbit)
    report(rows, compute, cfg, spec)


def sweep(emulate, state: dict, spec, args, numel: int) -> list[dict]:
    rows = []
    for factor in args.factors:
        rate = spec.link_mbit * factor
        emulate.reshape(spec.state_dir, rate)
        tcp = measure_tcp(emulate, state)
        ar = measure_allreduce(emulate, state, spec.workers_per_node, numel, args.rounds)
        rows.append({"configured_mbit": rate, "achieved_mbit": tcp, "allreduce_s": ar})
        print(
            f"  link {rate:8.1f} Mbit/s: TCP achieved {tcp:8.1f} Mbit/s (x{tcp / rate:.2f}), all-reduce {ar * 1e3:8.1f} ms"
        )
    return rows


def report(rows: list[dict], compute: float | None, cfg, spec) -> None:
    gbs = cfg.optimizer.reference_gbs or cfg.batch.gbs
    if compute is not None:
        print(f"compute per step, dp{cfg.cluster.num_workers} at GBS {gbs}: {compute * 1e3:.1f} ms")
        for r in rows:
            r["ratio"] = r["allreduce_s"] / compute
            print(f"  link {r['configured_mbit']:8.1f} Mbit/s: all-reduce/compute {r['ratio']:.3f}")
        # The all-reduce time scales as 1/rate: the rate whose ratio is each paper setting's.
        base = next(r for r in rows if r["configured_mbit"] == spec.link_mbit)
        for name, paper_gbs, ratio in paper_ratios():
            match = base["configured_mbit"] * base["ratio"] / ratio
            print(f"  paper {name} at GBS {paper_gbs}: ratio {ratio:.3f} -> matched by a link of {match:,.0f} Mbit/s")
    here = next((r for r in rows if r["configured_mbit"] == spec.link_mbit), rows[-1])
    ratio = f"{here['ratio']:.3f}" if "ratio" in here else "n/a"
    print(
        f"configured {here['configured_mbit']:g} Mbit/s: achieved {here['achieved_mbit']:.1f} Mbit/s "
        f"(x{here['achieved_mbit'] / here['configured_mbit']:.2f}); dp all-reduce/compute {ratio} at GBS {gbs}"
    )


if __name__ == "__main__":
    main()
