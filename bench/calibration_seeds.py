"""How many seeds does a calibration need? Its continuations refitted on every subset of k of
its seeds (copus.core.seed_power): how far a k-seed calibration's B_crit falls from the one all
the seeds give, and whether its 95% interval holds it.

    .venv/bin/python bench/calibration_seeds.py docs/results/calibration-tradeoff-transient.json --seeds 2 4
    .venv/bin/python bench/calibration_seeds.py docs/calibration-quickstart.json --seeds 1
    .venv/bin/python bench/calibration_seeds.py docs/calibration-quickstart.json --smoke

No training: the calibration file's points are refitted (each fit bootstraps its interval,
`--draws` times). The last line reads `seeds K: B_crit within x1.5 of all seeds' in A%,
intervals hold it in B% (worst branch point)` for the smallest K asked.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from smoke import parse_args

from copus.core.seed_power import CLOSE_FACTOR, seed_subsets


def table(rows: list[dict]) -> list[str]:
    lines = [
        f"{'seeds':>5} {'branch':>6} {'val loss':>8} {'B_crit (all)':>12} {'subsets':>7} "
        f"{'ratio 10/50/90%':>17} {'within':>7} {'covers':>7} {'width':>6}"
    ]
    for r in rows:
        lines.append(
            f"{r['seeds']:>5} {r['branch']:>6} {r['val_loss']:>8.3f} {r['b_crit']:>12.1f} {r['subsets']:>7} "
            f"{r['ratio_q10']:>5.2f} {r['ratio_median']:>5.2f} {r['ratio_q90']:>5.2f} "
            f"{r['within_close_factor']:>7.0%} {r['interval_covers']:>7.0%} {r['interval_width_median']:>6.1f}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "calibration",
        nargs="?",
        default="docs/results/calibration-tradeoff-transient.json",
        help="a calibration file (calibration-<id>.json or --json output; default: the trade-off workload's 8 seeds)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[2], help="subset sizes k")
    parser.add_argument("--limit", type=int, default=200, help="at most this many subsets per k (drawn at random)")
    parser.add_argument("--draws", type=int, default=400, help="bootstrap draws of each fit's interval")
    args = parse_args(
        parser, {"calibration": "docs/calibration-quickstart.json", "seeds": [1], "limit": 3, "draws": 50}
    )
    data = json.loads(Path(args.calibration).read_text())
    rows = [row for k in args.seeds for row in seed_subsets(data, k, args.limit, args.draws)]
    print("\n".join(table(rows)))
    print(json.dumps({"rows": rows}))
    k = min(args.seeds)
    worst = [r for r in rows if r["seeds"] == k]
    print(
        f"seeds {k}: B_crit within x{CLOSE_FACTOR:g} of all seeds' in {min(r['within_close_factor'] for r in worst):.0%}, "
        f"intervals hold it in {min(r['interval_covers'] for r in worst):.0%} (worst branch point)"
    )


if __name__ == "__main__":
    main()
