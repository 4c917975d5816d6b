"""Requests in flight over time, and the steady-state window found from it.

In flight = sent and not yet done, as the client sees it (every request counts, warm-up
included: it loads the engine all the same). The steady state is where the load is what
the workload asked for:
- it starts once the in-flight count first reaches its typical level (the time-weighted
  median over the sending period) and the first measured (non-warm-up) request is sent:
  before that the system is ramping up;
- it ends with the last send: after it no request arrives and the system only drains.
A window too short to mean anything (under MIN_SHARE of the run, or fewer than
MIN_REQUESTS measured requests sent in it) is not used: the whole run is, and the
window says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MIN_SHARE = 0.2
MIN_REQUESTS = 8
INTERNAL = {"json": False}  # fields kept out of metrics.json


@dataclass(frozen=True)
class Concurrency:
    """In flight as a step function: `count[i]` holds from `t[i]` to `t[i + 1]`."""

    t: np.ndarray
    count: np.ndarray

    @classmethod
    def of(cls, t_sent: np.ndarray, t_done: np.ndarray) -> Concurrency:
        sent = np.asarray(t_sent, dtype=np.float64)
        sent_ok = ~np.isnan(sent)
        done = np.asarray(t_done, dtype=np.float64)[sent_ok]
        sent = sent[sent_ok]
        end = np.nanmax(np.concatenate((sent, done))) if len(sent) else 0.0
        done = np.where(np.isnan(done), end, done)  # never finished: in flight to the end
        t = np.concatenate((sent, done))
        step = np.concatenate((np.ones(len(sent)), -np.ones(len(done))))
        order = np.lexsort((step, t))  # at one instant, leave before arriving
        return cls(t[order], np.cumsum(step[order]))

    def mean(self, a: float, b: float) -> float:
        """Time-weighted mean over [a, b]."""
        if b <= a or len(self.t) == 0:
            return float("nan")
        lo = np.clip(self.t, a, b)
        hi = np.clip(np.append(self.t[1:], b), a, b)
        return float((self.count * (hi - lo)).sum() / (b - a))

    def peak(self, a: float, b: float) -> int:
        inside = (self.t >= a) & (self.t <= b)
        before = np.searchsorted(self.t, a, side="right") - 1
        values = self.count[inside]
        if before >= 0:
            values = np.append(values, self.count[before])
        return int(values.max()) if len(values) else 0

    def median_level(self, a: float, b: float) -> float:
        """The level the count is at or above for half of [a, b]."""
        if b <= a or len(self.t) == 0:
            return 0.0
        lo = np.clip(self.t, a, b)
        hi = np.clip(np.append(self.t[1:], b), a, b)
        dur = hi - lo
        order = np.argsort(-self.count, kind="stable")
        covered = np.cumsum(dur[order])
        k = int(np.searchsorted(covered, 0.5 * (b - a)))
        return float(self.count[order][min(k, len(order) - 1)])


@dataclass(frozen=True)
class Window:
    start_ns: int
    end_ns: int
    duration_s: float
    steady: bool  # True: the steady state found; False: the whole run
    reason: str  # steady | requested-full | too-short | too-few-requests | no-requests
    ramp_up_s: float  # first send → window start
    drain_s: float  # window end → last completion
    level: float  # the in-flight level that marks the steady state
    t_start: float = field(default=0.0, metadata=INTERNAL)  # relative ns
    t_end: float = field(default=0.0, metadata=INTERNAL)


def find_window(requests, origin_ns: int, steady: bool = True) -> Window:
    """The analysis window over the lifecycle's requests (see the module docstring)."""
    sent = requests["t_sent"].to_numpy()
    done = done_times(requests)
    measured = ~requests["is_warmup"].to_numpy()
    if np.isnan(sent).all():
        return _window(0.0, 0.0, origin_ns, False, "no-requests", 0.0, 0.0, 0.0)
    t0, last_send = np.nanmin(sent), np.nanmax(sent)
    t_end = np.nanmax(np.concatenate((done, sent)))
    m_sent = sent[measured & ~np.isnan(sent)]
    m_first = m_sent.min() if len(m_sent) else t0
    full_end = np.nanmax(np.concatenate((done[measured], m_sent))) if len(m_sent) else t_end
    full = (m_first, full_end)
    if not steady:
        return _window(*full, origin_ns, False, "requested-full", m_first - t0, 0.0, 0.0)
    curve = Concurrency.of(sent, done)
    level = curve.median_level(t0, last_send)
    reached = curve.t[(curve.count >= level) & (curve.t <= last_send)]
    start = max(reached[0] if len(reached) else t0, m_first)
    end = last_send
    n_in = int(((m_sent >= start) & (m_sent <= end)).sum())
    if end - start < MIN_SHARE * (t_end - t0):
        return _window(*full, origin_ns, False, "too-short", m_first - t0, 0.0, level)
    if n_in < MIN_REQUESTS:
        return _window(*full, origin_ns, False, "too-few-requests", m_first - t0, 0.0, level)
    return _window(start, end, origin_ns, True, "steady", start - t0, t_end - end, level)


def done_times(requests) -> np.ndarray:
    done = requests["t_done"].to_numpy()
    return np.where(np.isnan(done), requests["t_last_chunk"].to_numpy(), done)


def _window(a, b, origin_ns, steady, reason, ramp, drain, level) -> Window:
    return Window(
        start_ns=int(origin_ns + round(a)),
        end_ns=int(origin_ns + round(b)),
        duration_s=float(b - a) / 1e9,
        steady=steady,
        reason=reason,
        ramp_up_s=float(ramp) / 1e9,
        drain_s=float(drain) / 1e9,
        level=float(level),
        t_start=float(a),
        t_end=float(b),
    )
