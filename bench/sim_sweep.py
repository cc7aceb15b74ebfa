"""A sweep of one field of a simulated setting under the comparison protocol: for each value,
COPUS against the best baseline of each kind (the paper's, the user-tuned, the hindsight-tuned)
and the perfect planner's ceiling over the hindsight-tuned one (issue 42 item 4: the cluster
size, the run length, the critical-batch model).

    .venv/bin/python bench/sim_sweep.py experiments/sim/paper_llama-3.2-3b_1x8-h100.yaml \\
        --field cluster.nodes --values 1 4 16 64 --set cluster.framework=megatron --set protocol.seeds=3
    .venv/bin/python bench/sim_sweep.py --smoke    # the 3B setting, nodes 1 and 2, one seed, to loss 3.0

Each value runs what `copus simulate --json` runs (`copus.sim.run.run_simulation`); `--out DIR`
keeps each value's JSON. The last line reads `sweep FIELD over N values: copus vs best
user-tuned A% to B%, vs hindsight-tuned C% to D%, ceiling over hindsight-tuned E% to F%`
(means over the seeds; simulated hours, not this machine's).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from copus.sim.config import load_sim_config
from copus.sim.run import run_simulation

KINDS = ("paper", "user_tuned", "hindsight_tuned")


def sweep_row(result: dict) -> dict:
    """The figures of one value: COPUS's hours and its paired speedup against each kind."""
    p = result["protocol"]
    copus = p["policies"]["copus"]
    kinds = {k: p["copus_vs_kind"][k] for k in KINDS if p["copus_vs_kind"].get(k)}
    return {
        "copus_h": copus["time_to_target_s"] / 3600 if copus["time_to_target_s"] else None,
        "reconfigurations": copus["reconfigurations"],
        "layout_changes": p["copus_layout_changes"]["mean"],
        "vs": {k: {"baseline": v["baseline"], **v["copus_vs"]} for k, v in kinds.items()},
        "ceiling_vs_hindsight": p["ceiling"]["vs_best_baseline"],
        "ceiling_h": p["ceiling"]["time_to_target_s"] / 3600 if p["ceiling"]["time_to_target_s"] else None,
    }


def row_text(field: str, value: str, row: dict) -> str:
    def kind(k: str) -> str:
        v = row["vs"].get(k)
        return "–" if v is None else f"{v['baseline']} {v['mean']:+.2%} (sd {v['sd']:.2%})"

    ceiling = row["ceiling_vs_hindsight"]
    return (
        f"| {field}={value} | {row['copus_h']:.1f} | {kind('paper')} | {kind('user_tuned')} | "
        f"{kind('hindsight_tuned')} | {'–' if ceiling is None else f'{ceiling:+.2%}'} | "
        f"{row['reconfigurations']:.1f} | {row['layout_changes']:.1f} |"
    )


def span(values: list[float | None]) -> str:
    got = [v for v in values if v is not None]
    return f"{min(got):+.2%} to {max(got):+.2%}" if got else "n/a"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("setting", nargs="?", default="experiments/sim/paper_llama-3.2-3b_1x8-h100.yaml")
    parser.add_argument("--field", default="cluster.nodes")
    parser.add_argument("--values", nargs="+", default=["1", "2"])
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, help="a folder for each value's JSON")
    parser.add_argument("--smoke", action="store_true", help="two values, one seed, a near target")
    args = parser.parse_args(argv)
    overrides = list(args.overrides)
    if args.smoke:
        overrides += ["protocol.seeds=1", "training.target_loss=3.0", "protocol.ramp_lengths=[1.0]"]
    print(
        f"| {args.field} | copus, h | best paper baseline | best user-tuned | best hindsight-tuned | ceiling | switches | layout changes |"
    )
    print("| --- | ---: | --- | --- | --- | ---: | ---: | ---: |")
    rows = []
    for value in args.values:
        result = run_simulation(load_sim_config(args.setting, [*overrides, f"{args.field}={value}"]))
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"{args.field}={value}.json").write_text(json.dumps(result, indent=1))
        rows.append(sweep_row(result))
        print(row_text(args.field, value, rows[-1]), flush=True)

    def means(kind: str) -> list[float | None]:
        return [r["vs"][kind]["mean"] if kind in r["vs"] else None for r in rows]

    print(
        f"sweep {args.field} over {len(rows)} values: copus vs best user-tuned {span(means('user_tuned'))}, "
        f"vs hindsight-tuned {span(means('hindsight_tuned'))}, ceiling over hindsight-tuned "
        f"{span([r['ceiling_vs_hindsight'] for r in rows])}"
    )


if __name__ == "__main__":
    main()
