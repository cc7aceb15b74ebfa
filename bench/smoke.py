"""The `--smoke` option every bench script has: its smallest sizes and one round, so that
`tests/test_bench_smoke.py` (part of `make test`) can check each script still runs and prints
its documented last line. Figures printed in smoke mode mean nothing."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def parse_args(parser: argparse.ArgumentParser, smoke: dict, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse argv; with --smoke, the values in `smoke` replace whatever was given for them."""
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="smallest sizes, one round: checks that the script runs (figures mean nothing)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        for name, value in smoke.items():
            setattr(args, name, value)
    return args
