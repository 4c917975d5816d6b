"""How the explorer writes numbers: short, unit-bearing, and '–' for what is unknown.

Plain functions of numbers to text, shared by the view models and the widgets, so a
value reads the same on every screen (and tests can check the text without Textual).
"""

from __future__ import annotations

import math

DASH = "–"


def missing(x) -> bool:
    return x is None or (isinstance(x, float) and not math.isfinite(x))


def num(x, digits: int = 3) -> str:
    """A plain number with about `digits` significant figures (thousands separated)."""
    if missing(x):
        return DASH
    if isinstance(x, int) or (float(x).is_integer() and abs(x) >= 1000):
        return f"{int(x):,}"
    x = float(x)
    if x == 0:
        return "0"
    if abs(x) >= 10 ** (digits - 1):
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def ms(seconds, digits: int = 3) -> str:
    """Seconds shown in milliseconds (the unit serving latencies are read in)."""
    return DASH if missing(seconds) else f"{num(float(seconds) * 1e3, digits)} ms"


def ms_ns(nanoseconds, digits: int = 3) -> str:
    return DASH if missing(nanoseconds) else ms(float(nanoseconds) / 1e9, digits)


def duration(seconds) -> str:
    """A duration in the unit that keeps it short: µs, ms or s."""
    if missing(seconds):
        return DASH
    s = float(seconds)
    if abs(s) >= 1:
        return f"{num(s)} s"
    if abs(s) >= 1e-3:
        return f"{num(s * 1e3)} ms"
    return f"{num(s * 1e6)} µs"


def pct(share, digits: int = 0) -> str:
    """A share (0.42) as a percentage ("42%"); small shares keep a decimal."""
    if missing(share):
        return DASH
    v = float(share) * 100
    if digits == 0 and 0 < abs(v) < 10:
        return f"{v:.1f}%"
    return f"{v:.{digits}f}%"


def si(x, unit: str = "") -> str:
    """A large quantity with an SI prefix: 1.2e12 FLOP/s → "1.2 TFLOP/s"."""
    if missing(x):
        return DASH
    v = float(x)
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= factor:
            return f"{v / factor:.3g} {prefix}{unit}"
    return f"{v:.3g} {unit}".strip()


def rate(x, unit: str = "/s") -> str:
    return DASH if missing(x) else f"{num(x)} {unit}".strip()


def clip(text: str, width: int) -> str:
    """Text cut to `width` characters, with an ellipsis when cut."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"
