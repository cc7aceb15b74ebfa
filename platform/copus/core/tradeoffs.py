"""What a search space offers a goodput policy: the two trade-offs of the paper's clusters,
read off a profile and a calibration.

- Hardware: the fastest configuration's throughput at each GBS. When it rises with the GBS
  (small batches leave the devices idle and pay per-step costs more often) a larger batch is
  worth something; when the fastest (layout, MBS) changes with the GBS (pipeline bubbles at
  few micro-batches, gradient all-reduce at many replicas) the layout is worth re-choosing.
- Statistics: the measured critical batch at each branch point of the calibration. When it
  grows over the run, the batch size that is efficient early is wasteful late and the reverse.

Pure: no torch, no ray.
"""

from __future__ import annotations

import math

from copus.core.layout import CandidateConfig


def fastest_by_gbs(throughputs: dict[CandidateConfig, float]) -> list[dict]:
    """Per GBS (ascending), the configuration of most samples/s and its throughput."""
    best: dict[int, tuple[CandidateConfig, float]] = {}
    for c, value in throughputs.items():
        if math.isfinite(value) and (c.gbs not in best or value > best[c.gbs][1]):
            best[c.gbs] = (c, value)
    return [
        {"gbs": gbs, "shape": c.shape_label(), "config": c.label(), "samples_per_s": value}
        for gbs, (c, value) in sorted(best.items())
    ]


def layouts_by_gbs(throughputs: dict[CandidateConfig, float]) -> dict[int, dict[str, float]]:
    """Per GBS, each layout's best throughput over its MBS and knobs (samples/s): the table that
    shows whether the layout must move with the batch."""
    table: dict[int, dict[str, float]] = {}
    for c, value in throughputs.items():
        if math.isfinite(value):
            row = table.setdefault(c.gbs, {})
            row[c.layout_label()] = max(value, row.get(c.layout_label(), 0.0))
    return dict(sorted(table.items()))


def layout_margins(table: dict[int, dict[str, float]]) -> list[dict]:
    """Per GBS the fastest layout and how far it is ahead of the best other layout (its
    throughput over theirs, minus 1; None with a single layout measured there)."""
    rows = []
    for gbs, by_layout in table.items():
        ranked = sorted(by_layout.items(), key=lambda kv: -kv[1])
        ahead = ranked[0][1] / ranked[1][1] - 1.0 if len(ranked) > 1 else None
        rows.append({"gbs": gbs, "fastest_layout": ranked[0][0], "samples_per_s": ranked[0][1], "ahead_by": ahead})
    return rows


def layout_boundary(table: dict[int, dict[str, float]], min_lead: float = 0.15) -> dict:
    """Whether the layout must move with the GBS: the fastest layout at the smallest GBS (A)
    differs from the fastest at the largest (B), and each leads the other by `min_lead` or more
    where it wins: A at the smallest GBS, B at the GBS where it is fastest with its largest lead
    over A (`large_gbs`; B may lead by less at the largest, where compute can drown both
    layouts' communication). A layout's throughput at a GBS is its best over its MBS."""
    margins = layout_margins(table)
    if len(margins) < 2:
        return {"must_move": False, "why": "fewer than two GBS measured"}
    a, b = margins[0]["fastest_layout"], margins[-1]["fastest_layout"]
    small = margins[0]["gbs"]

    def lead(winner: str, other: str, gbs: int) -> float | None:
        row = table[gbs]
        return row[winner] / row[other] - 1.0 if other in row else None

    lead_small = lead(a, b, small)
    b_wins = [(lead(b, a, m["gbs"]), m["gbs"]) for m in margins[1:] if m["fastest_layout"] == b != a]
    measured = [(x, gbs) for x, gbs in b_wins if x is not None]
    lead_large, large = max(measured) if measured else (None, margins[-1]["gbs"])
    leads = (lead_small, lead_large)
    return {
        "must_move": a != b and all(x is not None and x >= min_lead for x in leads),
        "small_gbs": small,
        "large_gbs": large,
        "largest_gbs": margins[-1]["gbs"],
        "fastest_at_small": a,
        "fastest_at_large": b,
        "lead_at_small": lead_small,
        "lead_at_large": lead_large,
        "lead_at_largest": lead(b, a, margins[-1]["gbs"]),
        "min_lead": min_lead,
    }


def tradeoffs(throughputs: dict[CandidateConfig, float], branch_points: list[dict] | None = None) -> dict:
    """The trade-off figures of a profile (and of a calibration's branch points when given):
    `throughput_ratio` (fastest at the largest GBS / fastest at the smallest), the fastest
    shapes at both ends and whether they differ, `b_crit_growth` (last / first branch point)."""
    rows = fastest_by_gbs(throughputs)
    table = layouts_by_gbs(throughputs)
    out: dict = {
        "fastest_by_gbs": rows,
        "layouts_by_gbs": [{"gbs": gbs, "samples_per_s": by_layout} for gbs, by_layout in table.items()],
        "layout_boundary": layout_boundary(table),
    }
    if rows:
        small, large = rows[0], rows[-1]
        out.update(
            {
                "smallest_gbs": small["gbs"],
                "largest_gbs": large["gbs"],
                "throughput_ratio": large["samples_per_s"] / small["samples_per_s"],
                "fastest_at_smallest_gbs": small["shape"],
                "fastest_at_largest_gbs": large["shape"],
                "fastest_shape_changes": small["shape"] != large["shape"],
            }
        )
    crit = [b["b_crit"] for b in branch_points or [] if b.get("b_crit") is not None and math.isfinite(b["b_crit"])]
    if len(crit) >= 2:
        out.update({"b_crit_first": crit[0], "b_crit_last": crit[-1], "b_crit_growth": crit[-1] / crit[0]})
    return out


def tradeoff_lines(t: dict) -> list[str]:
    """The figures as lines of text (the profile's printout, the report)."""
    lines = []
    if "throughput_ratio" in t:
        lines.append(
            f"fastest throughput: {t['fastest_by_gbs'][0]['samples_per_s']:.1f} samples/s at GBS "
            f"{t['smallest_gbs']} ({t['fastest_at_smallest_gbs']}) -> "
            f"{t['fastest_by_gbs'][-1]['samples_per_s']:.1f} at GBS {t['largest_gbs']} "
            f"({t['fastest_at_largest_gbs']}): x{t['throughput_ratio']:.2f}; fastest layout and MBS "
            + ("change with the GBS" if t["fastest_shape_changes"] else "are the same at both ends")
        )
    boundary = t.get("layout_boundary", {})
    if "lead_at_small" in boundary and boundary["fastest_at_small"] == boundary["fastest_at_large"]:
        lines.append(
            f"layout boundary: none, {boundary['fastest_at_small']} is the fastest layout at GBS "
            f"{boundary['small_gbs']} and at GBS {boundary['large_gbs']}"
        )
    elif "lead_at_small" in boundary:
        lead = [f"{x:+.0%}" if x is not None else "n/a" for x in (boundary["lead_at_small"], boundary["lead_at_large"])]
        lines.append(
            f"layout boundary: {boundary['fastest_at_small']} leads {boundary['fastest_at_large']} by {lead[0]} at GBS "
            f"{boundary['small_gbs']}; {boundary['fastest_at_large']} leads {boundary['fastest_at_small']} by "
            f"{lead[1]} at GBS {boundary['large_gbs']}{_at_the_largest(boundary)}: the layout "
            + (
                "must move"
                if boundary["must_move"]
                else f"need not move (each must lead by {boundary['min_lead']:.0%})"
            )
        )
    if "b_crit_growth" in t:
        lines.append(
            f"measured critical batch: {t['b_crit_first']:.3g} -> {t['b_crit_last']:.3g} over the run: "
            f"x{t['b_crit_growth']:.1f}"
        )
    return lines


def _at_the_largest(boundary: dict) -> str:
    """The lead at the largest GBS, where it is not the one the boundary was read at."""
    largest, x = boundary.get("largest_gbs"), boundary.get("lead_at_largest")
    if largest is None or largest == boundary["large_gbs"] or x is None:
        return ""
    return f" ({x:+.0%} at GBS {largest})"


def layout_table_lines(t: dict, crossing: dict[str, list[str] | None] | None = None) -> list[str]:
    """The layouts-by-GBS table as text: each layout's best samples/s at each GBS, the fastest
    marked, and under each layout which of its dimensions cross nodes when known."""
    rows = t.get("layouts_by_gbs") or []
    layouts = sorted({name for row in rows for name in row["samples_per_s"]})
    if not layouts:
        return []
    width = max(12, *(len(n) + 2 for n in layouts))
    lines = [
        "samples/s by layout (each at its best MBS; * the fastest)",
        "  GBS " + "".join(f"{n:>{width}}" for n in layouts),
    ]
    if crossing:
        cells = ["crosses: " + "+".join(crossing[n]) if crossing.get(n) else "in-node" for n in layouts]
        lines.append("      " + "".join(f"{c:>{width}}" for c in cells))
    for row in rows:
        values = row["samples_per_s"]
        top = max(values, key=values.get)
        cells = [f"{values[n]:.1f}{'*' if n == top else ' '}" if n in values else "-" for n in layouts]
        lines.append(f"{row['gbs']:>5} " + "".join(f"{c:>{width}}" for c in cells))
    return lines
