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


def tradeoffs(throughputs: dict[CandidateConfig, float], branch_points: list[dict] | None = None) -> dict:
    """The trade-off figures of a profile (and of a calibration's branch points when given):
    `throughput_ratio` (fastest at the largest GBS / fastest at the smallest), the fastest
    shapes at both ends and whether they differ, `b_crit_growth` (last / first branch point)."""
    rows = fastest_by_gbs(throughputs)
    out: dict = {"fastest_by_gbs": rows}
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
    if "b_crit_growth" in t:
        lines.append(
            f"measured critical batch: {t['b_crit_first']:.3g} -> {t['b_crit_last']:.3g} over the run: "
            f"x{t['b_crit_growth']:.1f}"
        )
    return lines
