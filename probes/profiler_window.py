"""A torch.profiler window over chosen engine steps, stored as spans linked to steps.

The profiler starts when step FIRST begins and stops when step LAST ends, in the engine's
own thread (through the step hooks), with a `perfdiag::step N` annotation around each
step. That thread is the profiler's only owner: torch keeps a profiling session in the
state of the thread that started it, and stopping it from another thread finds no session
and crashes the process at exit. So a window still open when the engine stops (the run's
end, Ctrl-C, SIGTERM, a failed step) is closed on that thread too, through the engine's
`on_close` hook; `finish()` on another thread never touches a running profiler.

The raw Kineto trace is kept under `raw/`; its events are imported as spans whose
`step_id` is the step they ran in (GPU work: the step of the launch that queued it).

Clocks: Kineto writes wall-clock µs. `perfdiag::clock_sync` annotations, each entered
between two `time.monotonic_ns()` readings, pin the trace to the run's monotonic clock to
within the tightest pair's gap (recorded as `clock_sync_uncertainty_ns`). Which step a
span belongs to never depends on that: it is read on the trace's own clock.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np

from ..traces.layout import RAW_DIR

SYNC = "perfdiag::clock_sync"
SYNC_SAMPLES = 8  # the tightest bracket of these pins the clocks
STEP_PREFIX = "perfdiag::step "


class ProfilerWindow:
    def __init__(self, first: int, last: int, device: str, run_dir: Path):
        self.first, self.last = first, last
        self.device = device
        self.trace_path = Path(run_dir) / RAW_DIR / f"profile_steps_{first}_{last}.json.gz"
        self._prof = None
        self._step_annotation = None
        self._sync: list[tuple[int, int]] = []  # (before, after) around each sync annotation
        self.steps: set[int] = set()
        self.overheads: list[tuple[str, int, int]] = []  # (what, start_ns, dur_ns)
        self.active = False
        self.ended_inside = False  # the engine stopped before step LAST ended
        self._owner: int | None = None  # the thread that started the profiler

    # -- called from the engine thread through the recorder --------------------------------
    # The profiler starts *between* steps (after step FIRST-1) and stops after step LAST:
    # its own start-up and shutdown never inflate a step. A window from step 0 has no step
    # before it, so its start-up falls inside step 0 (recorded as a probe span like the rest).
    def on_step_begin(self, step_id: int, start_ns: int) -> None:
        if step_id >= self.first and step_id <= self.last and self._prof is None:
            self._start()  # step FIRST-1 was never seen
        if self.active:
            from torch.autograd.profiler import record_function

            self.steps.add(step_id)
            self._step_annotation = record_function(f"{STEP_PREFIX}{step_id}")
            self._step_annotation.__enter__()

    def on_step_end(self, step_id: int, end_ns: int) -> None:
        if self.active:
            if self._step_annotation is not None:
                self._step_annotation.__exit__(None, None, None)
                self._step_annotation = None
            if step_id >= self.last:
                self._stop()
        elif step_id == self.first - 1 and self._prof is None:
            self._start()

    def close(self) -> None:
        """The engine stopped (on its stepping thread): end a window still open."""
        if self.active:
            self.ended_inside = True
            self._stop()

    def _start(self) -> None:
        from torch.autograd.profiler import record_function
        from torch.profiler import ProfilerActivity, profile

        t = time.monotonic_ns()
        activities = [ProfilerActivity.CPU]
        if self.device.startswith("cuda"):
            activities.append(ProfilerActivity.CUDA)
        # shapes give the GEMMs' FLOPs and bytes (traces/importers/op_cost.py); with_flops
        # adds torch's own figures where its build writes them (CUDA)
        self._prof = profile(activities=activities, record_shapes=True, with_flops=True)
        self._prof.start()
        for _ in range(SYNC_SAMPLES):
            before = time.monotonic_ns()
            with record_function(SYNC):
                after = time.monotonic_ns()
            self._sync.append((before, after))
        self.overheads.append(("profiler_start", t, time.monotonic_ns() - t))
        self._owner = threading.get_ident()
        self.active = True

    def _stop(self) -> None:
        t = time.monotonic_ns()
        self.active = False  # even if stop raises: it is never tried twice
        self._prof.stop()
        self.overheads.append(("profiler_stop", t, time.monotonic_ns() - t))

    # -- after the run ---------------------------------------------------------------------
    def finish(self, writer, clock: dict) -> dict:
        """Stop if still running, keep the raw trace, import its spans into `writer`.
        Returns what the manifest should say about the window."""
        info: dict = {"requested_steps": [self.first, self.last]}
        if self.active:
            if threading.get_ident() != self._owner:  # never stop it from another thread
                info["captured_steps"] = None
                info["reason"] = "the engine did not stop its profiler; the window is lost"
                return info
            self.close()
        if self._prof is None or not self.steps:
            info["captured_steps"] = None
            info["reason"] = "the run ended before the window's first step"
            return info
        if self.ended_inside:
            info["note"] = "the run ended inside the window"
        self.trace_path.parent.mkdir(exist_ok=True)
        self._prof.export_chrome_trace(str(self.trace_path))
        stats = self._import(writer, clock)
        tid = threading.get_native_id()
        for what, start, dur in self.overheads:  # visible as the gaps they cause
            writer.table("spans").append(
                (what, "probe", start, dur, os.getpid(), tid) + (None,) * 8
            )
        info.update(
            captured_steps=[min(self.steps), max(self.steps)],
            raw_trace=str(self.trace_path.relative_to(writer.path)),
            overhead_ns={what: dur for what, _, dur in self.overheads},
            **stats,
        )
        return info

    def _import(self, writer, clock: dict) -> dict:
        from ..traces.importers.kineto_events import FastReadFailed, KinetoFileReader

        for fast in (True, False):  # the exact reader when the fast one cannot read it
            rows: list[tuple] = []
            reader = KinetoFileReader(self.trace_path, rows.append, lambda row: None,
                                      rank_of=lambda header: None)  # fmt: skip
            try:
                reader.read(fast=fast)
                break
            except FastReadFailed:
                continue
        base = int(reader.stream.header.get("baseTimeNanoseconds") or 0)
        # Trace time (ns after `base`, wall clock) → the run's monotonic clock: first through
        # the manifest's clock origin, then pinned by the tightest sync annotation.
        offset = base - int(clock["wall_ns"]) + int(clock["monotonic_ns"])
        syncs = sorted(r[2] for r in rows if r[0] == SYNC)
        uncertainty = None
        if len(syncs) == len(self._sync):
            k = min(range(len(syncs)), key=lambda i: self._sync[i][1] - self._sync[i][0])
            before, after = self._sync[k]
            offset = (before + after) // 2 - syncs[k]
            uncertainty = after - before
        rows = [r for r in rows if r[0] != SYNC]
        mapped = self._assign_steps(rows, offset)
        table = writer.table("spans")
        for row in mapped:
            table.append(row)
        return {
            "spans": len(mapped),
            "spans_linked_to_steps": sum(r[9] is not None for r in mapped),
            "clock_sync_uncertainty_ns": uncertainty,
        }

    @staticmethod
    def _assign_steps(rows: list[tuple], offset: int) -> list[tuple]:
        """Set `step_id` and move to the run's clock. CPU spans belong to the step whose
        `perfdiag::step N` annotation contains them (same trace clock, so exact); GPU
        spans to the step of the launch that queued them (the correlation id)."""
        marks = sorted(
            (r[2], r[2] + r[3], int(r[0][len(STEP_PREFIX):]))
            for r in rows if r[0].startswith(STEP_PREFIX) and r[4] is not None
        )  # fmt: skip
        if not marks:
            return [(*r[:2], r[2] + offset, *r[3:]) for r in rows]
        starts = np.array([m[0] for m in marks], dtype=np.int64)
        ends = np.array([m[1] for m in marks], dtype=np.int64)
        ids = np.array([m[2] for m in marks], dtype=np.int64)
        span_start = np.array([r[2] for r in rows], dtype=np.int64)
        pos = np.clip(np.searchsorted(starts, span_start, side="right") - 1, 0, None)
        inside = (span_start >= starts[pos]) & (span_start <= ends[pos])
        step_of = np.where(inside, ids[pos], -1)
        by_correlation: dict[int, int] = {}
        for r, s in zip(rows, step_of, strict=True):
            if r[4] is not None and r[10] is not None and s >= 0:
                by_correlation.setdefault(r[10], int(s))  # a CPU launch with a correlation id
        out = []
        for r, s in zip(rows, step_of, strict=True):
            step = int(s) if s >= 0 else None
            if r[4] is None and r[10] is not None:  # GPU work: the step that launched it
                step = by_correlation.get(r[10], step)
            out.append((r[0], r[1], r[2] + offset, *r[3:9], step, *r[10:]))
        return out
