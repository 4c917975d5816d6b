"""A distribution in the numbers serving metrics report: count, mean, max and the
percentiles every tool prints (p50/p90/p95/p99), with numpy's linear interpolation (the
same as vLLM's and SGLang's benchmark scripts, so figures compare)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class Dist:
    count: int
    mean: float
    max: float
    p50: float
    p90: float
    p95: float
    p99: float

    @classmethod
    def of(cls, values) -> Dist:
        """Summarise `values`, ignoring NaN; an empty input gives count 0 and NaNs."""
        arr = np.asarray(values, dtype="float64")
        arr = arr[~np.isnan(arr)]
        if arr.size == 0:
            nan = float("nan")
            return cls(0, nan, nan, nan, nan, nan, nan)
        p = np.percentile(arr, PERCENTILES)
        return cls(
            count=int(arr.size),
            mean=float(arr.mean()),
            max=float(arr.max()),
            p50=float(p[0]),
            p90=float(p[1]),
            p95=float(p[2]),
            p99=float(p[3]),
        )
