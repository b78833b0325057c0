"""The hardware-aware draft budget: pick gamma so drafting the next window
takes about as long as verifying the current one, so neither side idles."""
from __future__ import annotations


def choose_gamma(draft_s_per_token: float, verify_s: dict[int, float], max_gamma: int) -> int:
    """Smallest gamma with gamma * t_draft >= t_verify(gamma).

    verify_s maps a verify size (tokens per target pass) to its measured time;
    sizes in between are interpolated linearly, beyond the last extrapolated.
    In a pipelined round the draft makes gamma forward passes while the target
    verifies the last committed token plus the pending window, whose first
    token the target already chose: gamma tokens in all.
    """
    if draft_s_per_token <= 0 or not verify_s:
        raise ValueError("need a positive draft time and at least one verify timing")
    for gamma in range(1, max_gamma + 1):
        if gamma * draft_s_per_token >= interpolate(verify_s, gamma):
            return gamma
    return max_gamma


def interpolate(points: dict[int, float], x: int) -> float:
    xs = sorted(points)
    if len(xs) == 1:
        return points[xs[0]]
    if x <= xs[0]:
        lo, hi = xs[0], xs[1]
    elif x >= xs[-1]:
        lo, hi = xs[-2], xs[-1]
    else:
        hi = next(v for v in xs if v >= x)
        lo = max(v for v in xs if v < x) if hi != x else hi
        if lo == hi:
            return points[hi]
    slope = (points[hi] - points[lo]) / (hi - lo)
    return points[lo] + slope * (x - lo)
