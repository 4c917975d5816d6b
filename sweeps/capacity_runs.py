"""`perfdiag capacity` on real runs: each repeat at a level is a normal run (engine_ref
or an HTTP target) in CAPACITY/runs/, analysed with the SLO and triaged, so the levels
either side of the capacity can be opened, compared and explained like any run.

Choices that make levels comparable:
- a rate level sends `rate × duration` requests (at least 2: one warm-up, one measured),
  so every level lasts about as long: an overloaded queue grows with time, and a fixed
  request count would hide overload at high rates. At low rates that can be fewer than
  `min_requests`: the duration asked is kept (it was not: 24 requests at 0.5 req/s took
  48 s of a 20 s --duration) and the caller says the attainment bounds will be wide;
- a concurrency level sends `concurrency × 8` requests (at least `min_requests`);
- repeat k uses the workload seed + k: capacity should not hang on one draw of prompts;
- without `--start`, the first upper level comes from the system's saturation: a closed
  loop at the engine's `max_seqs` (a target: 16 clients) measures the request
  throughput no open loop above can keep up with.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..analyzers.lifecycle import Missing
from ..analyzers.slo import Slo
from ..errors import ConfigError
from .capacity import MEETS, MISSES, CapacityResult, Level, Sample, SearchSettings, search
from .causes import NOT_A_LIMIT
from .measure import analyse, record, triage_point

MIN_REQUESTS = 24
MIN_RATE_REQUESTS = 2  # a rate level's floor: one warm-up request, one measured
REQUESTS_PER_CLIENT = 8
TARGET_PROBE_CONCURRENCY = 16
# The playbook's check that the SLO was met restates what the search measures (the
# symptom); the limit is the cause beside it, or else what the misses were made of.
SLO_CHECK = "slo-missed"


@dataclass(frozen=True)
class CapacityPlan:
    base: dict[str, Any]  # perfdiag run flags every level shares
    slo: Slo
    by: str = "rate"  # rate | concurrency
    duration_s: float = 20.0
    min_requests: int = MIN_REQUESTS
    target: str | None = None
    api_key: str | None = None

    def __post_init__(self) -> None:
        if self.by not in ("rate", "concurrency"):
            raise ConfigError(f"--by must be rate or concurrency, got {self.by!r}")
        if not (math.isfinite(self.duration_s) and 1 <= self.duration_s <= 86_400):
            raise ConfigError(f"duration must be within [1, 86400] s, got {self.duration_s}")
        for flag in ("rate", "concurrency", "closed", "requests"):
            if flag in self.base:
                raise ConfigError(f"{flag} is chosen by the search; leave it out of --set")
        from .spec import check_target_flags

        check_target_flags(self.base, self.target)

    def flags(self, x: float, repeat: int) -> dict[str, Any]:
        flags = dict(self.base)
        if self.by == "rate":
            flags["rate"] = x
            flags["requests"] = max(MIN_RATE_REQUESTS, math.ceil(x * self.duration_s))
        else:
            flags["concurrency"], flags["closed"] = int(x), True
            flags["requests"] = max(self.min_requests, int(x) * REQUESTS_PER_CLIENT)
        flags["seed"] = int(self.base.get("seed") or 0) + repeat
        return self.aimed(flags)

    def few_requests(self, x: float) -> bool:
        """A rate level whose --duration sends fewer than `min_requests` requests."""
        return self.by == "rate" and self.flags(x, 0)["requests"] < self.min_requests

    def check(self) -> None:
        """Build a level's run options now, so a bad flag fails before any run."""
        from ..probes.run_flag_options import build_options

        options, http = build_options(self.flags(1.0, 0))
        if http is None:
            options.engine.engine_config()

    def aimed(self, flags: dict[str, Any]) -> dict[str, Any]:
        """The flags with the HTTP target, when there is one."""
        if self.target:
            return {**flags, "target": self.target, "api_key": self.api_key}
        return flags


def measure_run(plan: CapacityPlan, flags: dict[str, Any], run_dir: Path, on_progress=None):
    from ..probes.run_flag_options import build_options

    options, http = build_options(flags)
    record(options, http, run_dir, on_progress=on_progress)
    m = analyse(run_dir, plan.slo)
    triage_point([m])
    return m


def sample_of(m) -> Sample:
    metrics = m.serving.metrics
    if isinstance(metrics, Missing) or metrics.goodput is None:
        return Sample(0, 0, str(m.path), "no-requests", "the run measured no requests")
    from ..analyzers.slo_misses import slo_misses

    g = metrics.goodput
    causes = [
        f
        for f in (m.triage.causes if m.triage else ())
        if f.check != SLO_CHECK and f.check not in NOT_A_LIMIT
    ]
    cause = causes[0] if causes else None
    qualifier = next((f.check for f in m.triage.qualifiers if f.severity != "info"), "")
    host = next((f.check for f in m.triage.causes if f.check.startswith("host")), "")
    misses = slo_misses(m.serving, g.slo)
    return Sample(g.judged, g.good, str(m.path), cause.check if cause else "none",
                  cause.title if cause else "no warning or critical finding",
                  misses.text() if misses is not None else "", qualifier or host)  # fmt: skip


@dataclass(frozen=True)
class Saturation:
    concurrency: int
    requests_per_s: float
    run: str
    cause: str
    cause_title: str


def saturation(plan: CapacityPlan, out_dir: Path, on_progress=None) -> Saturation:
    """The closed-loop throughput at the engine's batch limit (or 16 target clients)."""
    from ..probes.run_flag_options import build_options

    options, http = build_options(plan.aimed({**plan.base, "closed": True, "concurrency": 1}))
    c = TARGET_PROBE_CONCURRENCY if http is not None else options.engine.max_seqs
    flags = plan.aimed({**plan.base, "closed": True, "concurrency": c,
                        "requests": max(plan.min_requests, c * 4)})  # fmt: skip
    m = measure_run(plan, flags, out_dir / "runs" / f"saturation-c{c}", on_progress)
    metrics = m.serving.metrics
    rps = float("nan") if isinstance(metrics, Missing) else metrics.throughput.requests_per_s
    if not (rps > 0):
        raise ConfigError(f"the saturation run ({m.path}) completed no requests: give --start")
    s = sample_of(m)
    return Saturation(c, rps, str(m.path), s.cause, s.cause_title)


def run_capacity(
    plan: CapacityPlan,
    settings: SearchSettings,
    out_dir: Path,
    start: float | None = None,
    floor: float | None = None,
    on_run: Callable[[str, Any], None] | None = None,
    on_level: Callable[[Level], None] | None = None,
) -> tuple[CapacityResult, Saturation | None]:
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ConfigError(f"{out_dir}: already exists and is not an empty directory")
    plan.check()
    (out_dir / "runs").mkdir(parents=True, exist_ok=True)

    def progress(label: str):
        return (lambda p: on_run(label, p)) if on_run is not None else None

    sat = None
    if start is None:
        sat = saturation(plan, out_dir, progress("saturation"))
        start = sat.requests_per_s if plan.by == "rate" else float(sat.concurrency)

    def measure(x: float, repeat: int) -> Sample:
        name = f"{plan.by}={x:g}-r{repeat}"
        m = measure_run(plan, plan.flags(x, repeat), out_dir / "runs" / name, progress(name))
        return sample_of(m)

    finished: list[Level] = []

    def level_done(level: Level) -> None:
        finished.append(level)
        if on_level is not None:
            on_level(level)

    try:
        result = search(measure, start, settings, floor, level_done)
    except KeyboardInterrupt:
        kept = write_result(out_dir, plan, interrupted(finished, settings), sat)
        raise CapacityInterrupted(kept, len(finished)) from None
    write_result(out_dir, plan, result, sat)
    return result, sat


class CapacityInterrupted(Exception):
    """Ctrl-C or SIGTERM: the levels decided so far are in capacity.json."""

    def __init__(self, path: Path, levels: int):
        super().__init__(f"{levels} level(s) finished, kept in {path}")
        self.path, self.levels = path, levels


def interrupted(levels: list[Level], settings: SearchSettings) -> CapacityResult:
    """The levels decided before an interruption: the highest that met, the lowest that
    missed above it (either may be None), verdict `interrupted`."""
    meets = [v for v in levels if v.decision == MEETS]
    low = max(meets, key=lambda v: v.x, default=None)
    above = [v for v in levels if v.decision == MISSES and (low is None or v.x > low.x)]
    high = min(above, key=lambda v: v.x, default=None)
    return CapacityResult(low, high, list(levels), settings, "interrupted")


def write_result(out_dir: Path, plan: CapacityPlan, result: CapacityResult, sat) -> Path:
    conf = result.settings.confidence

    def level(v: Level | None):
        if v is None:
            return None
        lo, hi = v.bounds(conf)
        return {"x": v.x, "decision": v.decision, "forced": v.forced, "judged": v.judged,
                "good": v.good, "attainment": _num(v.attainment), "lower": lo, "upper": hi,
                "repeats": [asdict(s) for s in v.samples],
                "causes": [{"check": c, "title": t, "repeats": n}
                           for c, t, n in v.causes()]}  # fmt: skip

    data = {
        "by": plan.by,
        "slo": {k: v for k, v in asdict(plan.slo).items() if v is not None},
        "settings": asdict(result.settings),
        "verdict": result.verdict,
        "non_monotone": result.non_monotone,
        "capacity": level(result.capacity),
        "above": level(result.above),
        "saturation": asdict(sat) if sat is not None else None,
        "levels": [level(v) for v in result.levels],
    }
    path = out_dir / "capacity.json"
    tmp = path.with_name(path.name + ".tmp")  # a reader never sees half a file
    tmp.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def _num(x: float):
    return x if math.isfinite(x) else None
