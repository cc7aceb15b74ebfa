"""Several suites' comparison.json files of the same entries, pooled seed by seed: the paired
log-ratios of `--ours` and `--reference` against `--baseline`, of `--ours` against
`--reference`, and `--ours`'s share of `--reference`'s gain (copus.core.comparison), over the
repeats of every file together. Each suite is paired within itself (the runs of a seed ran
back to back), so pooling adds seeds without pairing runs from different days.

    .venv/bin/python bench/pool_suites.py docs/results/compare-cpu-gate.json docs/results/compare-cpu-default.json
    .venv/bin/python bench/pool_suites.py docs/results/compare-cpu-gate.json --smoke

No training. The last line reads `pooled N seeds: OURS reaches S% of REFERENCE's gain over
BASELINE (95% interval L% to H%)`, or says which bound is missing and why
(`copus.core.comparison.share_interval_text`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from smoke import parse_args

from copus.core.comparison import gain_share, paired_log_ratio, pooled_runs, share_interval_text


def read_suites(files: list[Path], policies: set[str]) -> list[dict]:
    """The pooled runs of these policies from every file (copus.core.comparison.pooled_runs)."""
    try:
        return pooled_runs([(str(path), json.loads(path.read_text())) for path in files], policies)
    except ValueError as err:
        raise SystemExit(str(err)) from None


def _percent(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def _line(name: str, paired: dict) -> str:
    ci = paired["speedup_ci95"] or [None, None]
    return f"{name:<40} {paired['n_pairs']:>5} {_percent(paired['speedup']):>8} ({_percent(ci[0])}, {_percent(ci[1])})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, default=[Path("docs/results/compare-cpu-gate.json")])
    parser.add_argument("--ours", default="copus-uncalibrated")
    parser.add_argument("--reference", default="copus")
    parser.add_argument("--baseline", default="static")
    parser.add_argument("--draws", type=int, default=4000, help="bootstrap draws of the share's interval")
    args = parse_args(parser, {"draws": 200})
    runs = read_suites(args.files, {args.ours, args.reference, args.baseline})
    rows = {
        f"{args.ours} vs {args.baseline}": paired_log_ratio(runs, args.baseline, args.ours),
        f"{args.reference} vs {args.baseline}": paired_log_ratio(runs, args.baseline, args.reference),
        f"{args.ours} vs {args.reference}": paired_log_ratio(runs, args.reference, args.ours),
    }
    print(f"{'pair (pooled over ' + str(len(args.files)) + ' files)':<40} {'seeds':>5} {'speedup':>8} (95% interval)")
    for name, paired in rows.items():
        print(_line(name, paired))
    share = gain_share(runs, args.ours, args.reference, args.baseline, draws=args.draws)
    print(json.dumps({"files": [str(f) for f in args.files], "paired": rows, "share": share}))
    print(
        f"pooled {share['n_pairs']} seeds: {args.ours} reaches "
        + ("n/a" if share["share"] is None else f"{share['share']:.0%}")
        + f" of {args.reference}'s gain over {args.baseline} ({share_interval_text(share)})"
    )


if __name__ == "__main__":
    main()
