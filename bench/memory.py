"""Bytes per rank of the four paper models (memory model, copus.core.memory) under the
throughput-best configuration at the smallest and the largest GBS of each paper setting, and the
same layout and batch shape without sharded data parallelism and recomputation: what the two
knobs buy, and whether the layout could run without them.

    .venv/bin/python bench/memory.py
    .venv/bin/python bench/memory.py --smoke     # one paper setting

The last line is one JSON object: {"rows": [{setting, gbs, config, gib_per_rank,
gib_unsharded_no_recompute, fits_unsharded_no_recompute, device_gib}, ...]}.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from smoke import parse_args

from copus.core.layout import CandidateConfig
from copus.core.memory import GIB, config_bytes
from copus.core.simulator import BF16, best_layout_by_gbs, memory_fits
from copus.sim.config import load_sim_config, setting_from

SETTINGS = sorted((Path(__file__).resolve().parents[1] / "experiments" / "sim").glob("paper_*.yaml"))


def _row(name: str, s, best: dict) -> dict:
    cfg = CandidateConfig.from_dict(best["config"])
    plain = replace(cfg, dp_shard="none", recompute="none")
    overhead = s.cluster.node.runtime_overhead_bytes

    def gib(c: CandidateConfig) -> float:
        return config_bytes(s.shape, c, s.seq_len, act_bytes=BF16, overhead_bytes=overhead).total / GIB

    return {
        "setting": name,
        "gbs": best["gbs"],
        "config": cfg.label(),
        "gib_per_rank": round(gib(cfg), 1),
        "gib_unsharded_no_recompute": round(gib(plain), 1),
        "fits_unsharded_no_recompute": memory_fits(s.cluster, s.shape, s.seq_len, plain),
        "device_gib": round(s.cluster.node.accelerator.memory_bytes / GIB, 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", type=Path, nargs="+", default=SETTINGS, help="simulation YAMLs")
    args = parse_args(parser, {"settings": SETTINGS[:1]}, argv)
    rows = []
    for path in args.settings:
        s = setting_from(load_sim_config(path))
        by_gbs = best_layout_by_gbs(s)
        for best in (by_gbs[0], by_gbs[-1]):
            rows.append(_row(path.stem.removeprefix("paper_"), s, best))
    print(f"{'setting':<24} {'GBS':>5} {'best configuration':<56} {'GiB/rank':>8} {'without both':>13}")
    for r in rows:
        plain = f"{r['gib_unsharded_no_recompute']:.1f}" + ("" if r["fits_unsharded_no_recompute"] else " (no fit)")
        print(f"{r['setting']:<24} {r['gbs']:>5} {r['config']:<56} {r['gib_per_rank']:>8.1f} {plain:>13}")
    print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
