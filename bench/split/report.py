"""The arithmetic of the three placements and the table the benchmark prints. Pure functions.

Per generated token, with `f` the share of the layers at the edge:

    all at the edge:    T_edge
    all at the centre:  T_centre            (streamed; the RTT is paid once, before the first token)
    split:              f*T_edge + (1-f)*T_centre + RTT + bytes/bandwidth

The split's compute term is a weighted mean of the two whole placements, so it is never below the
faster of them, and the link terms only add to it: one of the two whole placements always wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Placements:
    """Seconds per generated token of each placement, from the formula."""

    edge: float
    centre: float
    split: float

    @property
    def best_whole(self) -> float:
        return min(self.edge, self.centre)


def split_token_seconds(edge_share: float, t_edge: float, t_centre: float, rtt: float,
                        bytes_per_token: float = 0.0, bandwidth: float = float("inf")) -> float:
    """Seconds per token when the first `edge_share` of the layers run at the edge and the rest at
    the centre: the two compute shares, one round trip, and the activations on the wire
    (`bandwidth` in bytes per second)."""
    if not 0.0 <= edge_share <= 1.0:
        raise ValueError(f"edge_share must be within [0, 1], not {edge_share}")
    if min(t_edge, t_centre, rtt, bytes_per_token) < 0 or bandwidth <= 0:
        raise ValueError("times, RTT and bytes must be >= 0 and bandwidth > 0")
    return edge_share * t_edge + (1 - edge_share) * t_centre + rtt + bytes_per_token / bandwidth


def placements(edge_share: float, t_edge: float, t_centre: float, rtt: float,
               bytes_per_token: float = 0.0, bandwidth: float = float("inf")) -> Placements:
    return Placements(edge=t_edge, centre=t_centre,
                      split=split_token_seconds(edge_share, t_edge, t_centre, rtt, bytes_per_token, bandwidth))


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares `y = intercept + slope * x`; returns (intercept, slope)."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError("need at least two (x, y) pairs of equal length")
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        raise ValueError("the x values must not all be equal")
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread
    return mean_y - slope * mean_x, slope


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool] | None = None) -> str:
    """A Markdown table whose columns line up in a terminal too; `right[i]` right-aligns column i
    (numbers), the default is every column but the first."""
    width = len(headers)
    if any(len(row) != width for row in rows):
        raise ValueError(f"every row needs {width} cells")
    right = list(right) if right is not None else [i > 0 for i in range(width)]
    sizes = [max([len(headers[i])] + [len(row[i]) for row in rows]) for i in range(width)]

    def line(cells: Sequence[str]) -> str:
        padded = [c.rjust(sizes[i]) if right[i] else c.ljust(sizes[i]) for i, c in enumerate(cells)]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(("-" * (sizes[i] + 1) + ":") if right[i] else ("-" * (sizes[i] + 2)) for i in range(width)) + "|"
    return "\n".join([line(headers), rule] + [line(row) for row in rows])


def per_second(seconds_per_token: float) -> float:
    return 1.0 / seconds_per_token if seconds_per_token > 0 else float("inf")
