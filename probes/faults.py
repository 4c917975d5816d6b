"""Deliberate faults for diagnosis experiments: engine hooks that really slow a named part.

The diagnosis suite (benchmarks/diagnosis) proves the playbooks on runs that are broken
on purpose. A fault here never writes an event: it wraps the run's observer and spends
real time at one point of the engine's work, so everything the probes record is what
happened. The points, and where their time lands in the lifecycle:

- `input_delay_ms` (+ `input_delay_per_token_us` × prompt tokens): after a request
  arrives and before it is validated and tokenised, on the thread that adds it — a slow
  input path (tokeniser, validation, multimodal preprocessing). In `perfdiag run` that is
  the asyncio thread, as in a server whose tokenisation blocks its event loop;
- `schedule_delay_ms`: inside each step's `schedule` phase — a slow scheduler;
- `step_gap_ms`: after each step ends and before the next begins — host work between
  forward passes (output processing, detokenisation, bookkeeping).
- `restore_delay_us` (per block): inside each restore from the prefix cache's host tier
  (`--kv-offload-mb`), within its timing — a slow host → device copy (a PCIe link shared
  or throttled, pageable instead of pinned memory). Applied by `slow_restore` on the
  engine's host tier, not at a hook.
- `draft_delay_ms`: inside each call for speculative drafts (the `draft` phase) — a slow
  proposer, its time where a slow draft model's or n-gram lookup's would be. Applied by
  wrapping the engine's proposer (`slow_proposer`), not at a hook.
- `scheduler_work_ms`: inside each call of the engine's scheduler, by wrapping it
  (`slow_scheduler`) — a slow scheduler whose time moves with the scheduler: the
  `schedule` phase, or `schedule_ahead` (overlapped with the forward) under
  --async-scheduling, where `schedule_delay_ms` (a hook at the step's start) would not.

- `slow_rank` (tensor parallelism): one rank made slower from outside its process, so
  the others wait for it in every collective — `slow_rank_neighbours` processes spinning
  on the core that rank is pinned to (contention on one rank's host), and/or
  `slow_rank_stall_ms` of SIGSTOP every `slow_rank_period_ms` (a rank that stalls: a
  preempted VM, a paging host). Applied by `rank_fault` while the run records.

`busy=True` spins the CPU instead of sleeping (CPU work that holds the GIL, as Python
host code does); sleeping is the default because it costs shared machines nothing.

`burning(load)` is the one fault outside the engine: other processes spinning on the
same cores while a run records (a noisy neighbour), `load` cores' worth of them: an
integer load as that many processes that never sleep, a fractional one as
BURNERS_PER_CORE processes per core (at least ⌈load⌉), each busy its share of every
10 ms. Nothing of it is recorded in the run: the host-contention check must find it from
what the probes saw.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from ..engine_ref.hooks import (
    EngineObserver,
    RequestEvent,
    RequestEventKind,
    StepBegin,
    StepEvent,
)
from ..errors import ConfigError
from ..traces.environment import machine_cores

# The faults that spend time at an engine hook (FaultObserver); the rest act from outside.
_HOOK_FAULTS = ("input_delay_ms", "input_delay_per_token_us", "schedule_delay_ms", "step_gap_ms",
                "draft_delay_ms", "scheduler_work_ms")  # fmt: skip


@dataclass(frozen=True)
class FaultOptions:
    input_delay_ms: float = 0.0
    input_delay_per_token_us: float = 0.0
    schedule_delay_ms: float = 0.0
    step_gap_ms: float = 0.0
    draft_delay_ms: float = 0.0
    scheduler_work_ms: float = 0.0
    restore_delay_us: float = 0.0  # per block restored from the host tier
    busy: bool = False
    slow_rank: int | None = None
    slow_rank_neighbours: int = 0
    slow_rank_stall_ms: float = 0.0
    slow_rank_period_ms: float = 20.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type in ("float", "int") and not value >= 0:
                raise ConfigError(f"fault {f.name} must be >= 0, got {value}")
        if self.slow_rank is not None:
            if self.slow_rank < 0:
                raise ConfigError(f"fault slow_rank must be >= 0, got {self.slow_rank}")
            if not (self.slow_rank_neighbours or self.slow_rank_stall_ms):
                raise ConfigError(
                    "fault slow_rank needs slow_rank_neighbours or slow_rank_stall_ms"
                )
            if self.slow_rank_stall_ms and self.slow_rank == 0:
                raise ConfigError("fault slow_rank_stall_ms stops a worker: slow_rank must be >= 1")
            if self.slow_rank_stall_ms >= self.slow_rank_period_ms:
                raise ConfigError("fault slow_rank_stall_ms must be < slow_rank_period_ms")

    def check_ranks(self, ranks: int) -> None:
        """Refuse a slow rank the engine does not have (before anything is recorded)."""
        if self.slow_rank is not None and self.slow_rank >= ranks:
            raise ConfigError(f"fault slow_rank {self.slow_rank}: the run has {ranks} rank(s) "
                              "(use --tp)")  # fmt: skip

    @property
    def active(self) -> bool:
        return self.hooks_active or self.slow_rank is not None or self.restore_delay_us > 0

    @property
    def hooks_active(self) -> bool:
        return any(getattr(self, name) > 0 for name in _HOOK_FAULTS)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def slow_proposer(self, engine) -> None:
        """With `draft_delay_ms`: the engine's proposer spends it in every propose call."""
        if self.draft_delay_ms > 0 and getattr(engine, "proposer", None) is not None:
            engine.proposer = SlowProposer(engine.proposer, self.draft_delay_ms * 1e-3, self.busy)

    def slow_restore(self, engine) -> None:
        """With `restore_delay_us`: each host-tier restore spends it per block."""
        tier = getattr(getattr(engine, "block_manager", None), "host_tier", None)
        if self.restore_delay_us > 0 and tier is not None:
            seconds, busy = self.restore_delay_us * 1e-6, self.busy
            tier.slow_restore = lambda blocks: spend(blocks * seconds, busy)

    def slow_scheduler(self, engine) -> None:
        """With `scheduler_work_ms`: the engine's scheduler spends it in every call."""
        if self.scheduler_work_ms <= 0:
            return
        inner, seconds, busy = engine.scheduler.schedule, self.scheduler_work_ms * 1e-3, self.busy

        def schedule(now_ns):
            spend(seconds, busy)
            return inner(now_ns)

        engine.scheduler.schedule = schedule

    def wrap(self, observer: EngineObserver) -> EngineObserver:
        """The observer to give the engine: `observer` itself when no fault is set."""
        return FaultObserver(observer, self) if self.hooks_active else observer


def spend(seconds: float, busy: bool) -> None:
    if seconds <= 0:
        return
    if not busy:
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _forwarding(cls):
    """Give `cls` a forwarder to `self.inner` for every hook of the observer protocol
    (EngineObserver's methods) that it does not define itself, so that a hook added to the
    protocol later reaches the wrapped observer too: the base's no-op would drop it."""

    def forwarder(name: str):
        def forward(self, *args, **kwargs):
            return getattr(self.inner, name)(*args, **kwargs)

        forward.__name__ = forward.__qualname__ = name
        return forward

    for name, member in vars(EngineObserver).items():
        if callable(member) and not name.startswith("_") and name not in vars(cls):
            setattr(cls, name, forwarder(name))
    return cls


@_forwarding
class FaultObserver(EngineObserver):
    """Forwards every hook to `inner` first (its timestamps are already taken), then
    spends the fault's time, so the engine's next timestamp comes after it. Hooks it
    does not define are forwarded as they are (`_forwarding`)."""

    def __init__(self, inner: EngineObserver, faults: FaultOptions):
        self.inner, self.faults = inner, faults

    def __getattr__(self, name: str):
        # The recorder is also the load client's sink (client_event, request_done).
        return getattr(self.inner, name)

    def on_request(self, event: RequestEvent) -> None:
        self.inner.on_request(event)
        f = self.faults
        if event.kind == RequestEventKind.ARRIVED:
            delay = f.input_delay_ms * 1e-3 + f.input_delay_per_token_us * 1e-6 * event.num_tokens
            spend(delay, f.busy)

    def on_step_begin(self, event: StepBegin) -> None:
        self.inner.on_step_begin(event)
        spend(self.faults.schedule_delay_ms * 1e-3, self.faults.busy)

    def on_step(self, event: StepEvent) -> None:
        self.inner.on_step(event)
        spend(self.faults.step_gap_ms * 1e-3, self.faults.busy)


BURN_PERIOD_S = 0.01  # a duty-cycled burner's period: a few scheduler slices
# A fractional load is spread over this many duty-cycled processes per core, so that it
# lands on every core alike, as fair sharing assumes (the generator's label). Two
# burners at 0.88 of each 10 ms on 2 cores settled where the scheduler woke them: six
# identical runs of tiny beside them lost 0.004-0.46 of step time (label 0.32), the
# sampler saw them use 0.56-1.25 cores; eight at 0.22 lost 0.23-0.45 (g2010-0050).
BURNERS_PER_CORE = 4


def _burner(duty: float) -> str:
    if duty >= 1.0:
        return "while True: pass"
    busy, idle = round(duty * BURN_PERIOD_S, 6), round((1 - duty) * BURN_PERIOD_S, 6)
    return (
        "import time\n"
        "while True:\n"
        f"    t = time.perf_counter() + {busy!r}\n"
        "    while time.perf_counter() < t: pass\n"
        f"    time.sleep({idle!r})\n"
    )


@contextlib.contextmanager
def burning(load: float) -> Iterator[None]:
    """`load` cores' worth of spinning processes for the duration: an integer load as
    that many `while True: pass`, a fractional one as BURNERS_PER_CORE processes per
    core (at least ⌈load⌉), each busy load/processes of the time."""
    processes = math.ceil(load - 1e-9) if load > 0 else 0
    if processes and abs(load - round(load)) > 1e-9:
        processes = max(processes, BURNERS_PER_CORE * machine_cores())
    code = _burner(load / processes) if processes else ""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(processes)
    ]
    try:
        time.sleep(0.2 if procs else 0.0)  # let them reach the run queue
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


@contextlib.contextmanager
def rank_fault(faults: FaultOptions | None, rank_pids: list[int]) -> Iterator[None]:
    """Slow rank `faults.slow_rank` (its process is `rank_pids[rank]`) while the block runs:
    pin it to one core and start neighbours spinning there, and/or stop it for
    `slow_rank_stall_ms` every `slow_rank_period_ms`. Nothing when no rank fault is set."""
    if faults is None or faults.slow_rank is None:
        yield
        return
    faults.check_ranks(len(rank_pids))
    rank = faults.slow_rank
    pid = rank_pids[rank]
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    neighbours: list[subprocess.Popen] = []
    stop = threading.Event()
    staller = None
    try:
        if faults.slow_rank_neighbours and cores:
            core = {cores[rank % len(cores)]}
            _pin_process(pid, core)
            for _ in range(faults.slow_rank_neighbours):
                p = subprocess.Popen(
                    [sys.executable, "-c", "while True: pass"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                neighbours.append(p)
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(p.pid, core)
        if faults.slow_rank_stall_ms:
            staller = threading.Thread(
                target=_stall, name="fault-stall", daemon=True,
                args=(pid, faults.slow_rank_stall_ms / 1e3, faults.slow_rank_period_ms / 1e3,
                      stop),
            )  # fmt: skip
            staller.start()
        yield
    finally:
        stop.set()
        if staller is not None:
            staller.join()
        for p in neighbours:
            p.kill()
        for p in neighbours:
            p.wait()


def _pin_process(pid: int, cores: set[int]) -> None:
    """Every thread of `pid` onto `cores` (sched_setaffinity on a pid moves one thread)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    for tid in tids:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, cores)


def _stall(pid: int, stall_s: float, period_s: float, stop: threading.Event) -> None:
    while not stop.wait(period_s - stall_s):
        try:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(stall_s)
        except OSError:
            return
        finally:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)


class SlowProposer:
    """A proposer that spends `seconds` in each propose call before the real one's."""

    def __init__(self, inner, seconds: float, busy: bool):
        self.inner, self.seconds, self.busy = inner, seconds, busy

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def propose(self, requests, k):
        spend(self.seconds, self.busy)
        return self.inner.propose(requests, k)
