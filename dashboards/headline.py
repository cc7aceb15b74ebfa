"""The README's headline results: a short table and one figure, both read from the committed
results files (docs/results/*.json, the comparison.json of each suite), never typed by hand.

    .venv/bin/python -m dashboards.headline            # prints the table, writes docs/headline.svg
    .venv/bin/python -m dashboards.headline --check    # exit 1 when the README or the figure drifted

Each headline is a paired speedup under the comparison protocol (seeds no setting was tuned on,
runs of a seed back to back): exp(mean log(t_reference / t_ours)) − 1 with its 95% interval
(`copus.core.comparison.paired_log_ratio`), over one suite or several pooled seed by seed
(`pooled_runs`). `tests/test_headline.py` keeps the README's table and the figure equal to them.
"""

from __future__ import annotations

import argparse
import html
import io
import json
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from copus.core.comparison import paired_log_ratio, pooled_runs

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
FIGURE = ROOT / "docs" / "headline.svg"
README = ROOT / "README.md"


@dataclass(frozen=True)
class Headline:
    """One row: `ours` against `reference`, paired by seed, over the runs of `files` pooled."""

    claim: str
    files: tuple[str, ...]  # under docs/results
    ours: str
    reference: str
    command: str  # what reproduces it (the suites' runs; pooling is bench/pool_suites.py)


HEADLINES = (
    Headline(
        "COPUS, calibrated, threshold rule, against the best tuned baseline (static GBS 16)",
        ("compare-cpu-tradeoff.json",),
        "copus",
        "tuned-static",
        "copus compare experiments/compare_cpu_tradeoff.yaml",
    ),
    Headline(
        "COPUS without a calibration, threshold rule, against static GBS 16",
        ("compare-cpu-gate.json", "compare-cpu-default.json"),
        "copus-uncalibrated",
        "static",
        "copus compare experiments/compare_cpu_gate.yaml; copus compare experiments/compare_cpu_default.yaml; "
        "python bench/pool_suites.py docs/results/compare-cpu-gate.json docs/results/compare-cpu-default.json",
    ),
    Headline(
        "COPUS as a new user gets it (no calibration, quantile rule) against static GBS 16",
        ("compare-cpu-rule.json",),
        "copus",
        "static",
        "copus compare experiments/compare_cpu_rule.yaml",
    ),
    Headline(
        "the quantile switching rule against the 10% threshold rule, both without a calibration",
        ("compare-cpu-rule.json",),
        "copus",
        "copus-threshold",
        "copus compare experiments/compare_cpu_rule.yaml",
    ),
    Headline(
        "COPUS as a new user gets it under the rules of Dec 6 (also: the rest of the run over the latest "
        "doubling, candidates at the run's own speed) against static GBS 16",
        ("compare-cpu-rule-dec6.json",),
        "copus",
        "static",
        "copus compare experiments/compare_cpu_rule_dec6.yaml",
    ),
    Headline(
        "the rules of Dec 6 against those of Dec 5 (the latest 8 evaluations, profile speeds)",
        ("compare-cpu-rule-dec6.json",),
        "copus",
        "copus-dec5",
        "copus compare experiments/compare_cpu_rule_dec6.yaml",
    ),
    Headline(
        "EMULATED 2-node cluster (CPU compute, 185 Mbit/s links), layout suite: COPUS against the best "
        "baseline (tuned ramp); the layout never moved",
        ("compare-emulated-layout.json",),
        "copus",
        "tuned-ramp",
        "copus compare experiments/compare_emulated_layout.yaml (root)",
    ),
    Headline(
        "same suite: COPUS against its copus-gbs ablation (layout and MBS kept)",
        ("compare-emulated-layout.json",),
        "copus",
        "copus-gbs",
        "copus compare experiments/compare_emulated_layout.yaml (root)",
    ),
    Headline(
        "EMULATED 2-node cluster, second layout suite (links re-capped to the machine's compute at every "
        "run, target 1.6): COPUS against the best baseline (tuned ramp); the layout never moved",
        ("compare-emulated-layout-v2.json",),
        "copus",
        "tuned-ramp",
        "copus compare experiments/compare_emulated_layout_v2.yaml (root)",
    ),
    Headline(
        "same suite: COPUS against its copus-gbs ablation",
        ("compare-emulated-layout-v2.json",),
        "copus",
        "copus-gbs",
        "copus compare experiments/compare_emulated_layout_v2.yaml (root)",
    ),
)


@dataclass(frozen=True)
class HeadlineRow:
    headline: Headline
    speedup: float
    ci95: tuple[float, float]
    seeds: list[int]
    excluded: int  # pairs left out (ours missed the target)

    def figure_text(self) -> str:
        """The figures as the table and the figure print them."""
        lo, hi = self.ci95
        return f"{self.speedup:+.1%} ({lo:+.1%} to {hi:+.1%})"

    def seeds_text(self) -> str:
        spans: list[list[int]] = []
        for seed in sorted(self.seeds):
            if spans and seed == spans[-1][1] + 1:
                spans[-1][1] = seed
            else:
                spans.append([seed, seed])
        where = ", ".join(f"{a}–{b}" if b > a else str(a) for a, b in spans)
        missed = f", {self.excluded} pair(s) left out: ours missed the target" if self.excluded else ""
        return f"{len(self.seeds)} seeds: {where}{missed}"


def headline_row(headline: Headline, results: Path = RESULTS) -> HeadlineRow | None:
    """The row read from the committed files; None while one of them is not committed yet."""
    paths = [results / f for f in headline.files]
    if not all(p.is_file() for p in paths):
        return None
    runs = pooled_runs([(p.name, json.loads(p.read_text())) for p in paths], {headline.ours, headline.reference})
    paired = paired_log_ratio(runs, headline.reference, headline.ours)
    if paired["speedup_ci95"] is None:
        return None
    seeds = [p["seed"] for p in paired["pairs"]]
    return HeadlineRow(headline, paired["speedup"], tuple(paired["speedup_ci95"]), seeds, paired["pairs_excluded"])


def headline_rows(results: Path = RESULTS) -> list[HeadlineRow]:
    return [row for h in HEADLINES if (row := headline_row(h, results)) is not None]


def headline_table(rows: list[HeadlineRow]) -> str:
    """The README's table (markdown)."""
    lines = [
        "| claim | paired speedup (95% interval) | evaluation seeds | reproduce |",
        "| --- | --- | --- | --- |",
    ]
    for row in rows:
        files = ", ".join(f"[{f}](docs/results/{f})" for f in row.headline.files)
        lines.append(
            f"| {row.headline.claim} | **{row.figure_text()}** | {row.seeds_text()} | "
            f"`{row.headline.command}` ({files}) |"
        )
    return "\n".join(lines)


def headline_figure(rows: list[HeadlineRow]) -> str:
    """Each headline's paired speedup with its 95% interval, one line each, zero marked (SVG
    text; its labels are text elements, so the test can read the figures back)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "copus-headline"}):
        fig, ax = plt.subplots(figsize=(7.0, 0.6 + 0.7 * len(rows)))
        for i, row in enumerate(reversed(rows)):
            lo, hi = row.ci95
            err = [[100 * (row.speedup - lo)], [100 * (hi - row.speedup)]]
            ax.errorbar([100 * row.speedup], [i], xerr=err, fmt="o", color="tab:blue", capsize=4)
            ax.annotate(row.figure_text(), (100 * hi, i), xytext=(6, -3), textcoords="offset points", fontsize=8)
        ax.axvline(0.0, color="grey", lw=1, ls="--")
        claims = [textwrap.fill(r.headline.claim, 44) for r in reversed(rows)]
        ax.set_yticks(range(len(rows)), claims, fontsize=8)
        ax.set_ylim(-0.6, len(rows) - 0.4)
        left = 100 * min([0.0] + [r.ci95[0] for r in rows]) - 2.0
        right = 100 * max([0.0] + [r.ci95[1] for r in rows])
        ax.set_xlim(left, right + 0.5 * (right - left))  # room for the figures right of each line
        ax.set_xlabel("paired speedup in time to target, % (95% interval)", fontsize=9)
        out = io.StringIO()
        fig.savefig(out, format="svg", bbox_inches="tight", metadata={"Date": None})
        plt.close(fig)
    return out.getvalue()


def figure_says(path: Path, rows: list[HeadlineRow]) -> bool:
    """Whether the figure at `path` shows exactly these rows: each claim and its figures as text,
    and no other headline (its pixels may differ with the fonts; its numbers may not)."""
    if not path.is_file():
        return False
    text = html.unescape(path.read_text())
    shown = all(textwrap.fill(r.headline.claim, 44).splitlines()[0] in text and r.figure_text() in text for r in rows)
    others = [
        h
        for h in HEADLINES
        if h not in {r.headline for r in rows} and textwrap.fill(h.claim, 44).splitlines()[0] in text
    ]
    return shown and not others


def readme_block(rows: list[HeadlineRow]) -> str:
    """What sits between the README's headline markers."""
    return headline_table(rows) + "\n\n![The headline results, paired speedups with 95% intervals](docs/headline.svg)"


BEGIN, END = "<!-- headline: begin (python -m dashboards.headline) -->", "<!-- headline: end -->"


def readme_with(text: str, block: str) -> str:
    """The README text with the block between the markers replaced."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + block + "\n" + text[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the README's table or the figure drifted")
    args = parser.parse_args(argv)
    rows = headline_rows()
    block, svg = readme_block(rows), headline_figure(rows)
    readme = README.read_text()
    if args.check:
        stale = [n for n, ok in (("README.md", readme_with(readme, block) == readme), ("docs/headline.svg", figure_says(FIGURE, rows))) if not ok]  # fmt: skip
        if stale:
            print(f"headline results drifted from docs/results: {', '.join(stale)}; run python -m dashboards.headline")
            return 1
        return 0
    README.write_text(readme_with(readme, block))
    FIGURE.write_text(svg)
    print(headline_table(rows))
    print(f"wrote {FIGURE.relative_to(ROOT)} and the README's table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
