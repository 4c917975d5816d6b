"""`perfdiag run --target URL`: a workload against an OpenAI-compatible server, into a run.

No engine is built. The run holds what the client can know: the client-side lifecycle of
every request (the same events as an in-process run, plus HTTP connection timings), one
`requests` row per request with what the server reported (`args`: status, usage, how
tokens per chunk were counted), and counters:
  client_loop_lag_max_s, client_loop_cpu_pct, client_process_cpu_pct (scope client):
      the load generator's own health, so a client-bound run is flagged, not blamed on
      the server (manifest `client_health`);
  the target's /metrics gauges and counters (scope target), scraped every few hundred ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..traces import environment
from ..traces.manifest import COMPLETE, CRASHED, INTERRUPTED
from ..traces.writer import RunWriter
from .client import ClientResult, Progress, drive
from .http_target import HttpTarget
from .metrics_scrape import MetricsScraper
from .recorder import RunRecorder
from .run_options import RunOptions
from .server_args import kind_from_models, server_kind
from .server_launch import (
    RUN_LOG,
    LaunchedServer,
    LaunchSpec,
    launch_for_run,
    launch_record,
    server_facts,
)
from .server_profile import (
    INTERRUPTED_WAIT_S,
    WAIT_S,
    ServerProfiler,
    ServerProfileSpec,
    check_launch,
    expected_workers,
)
from .session import ProgressCallback, SessionResult, _claim_directory, _report
from .workload import plan

# A client is called bound when its event-loop thread is this busy in this share of the
# windows, or its loop lags this much at p99: its timings then measure itself.
BUSY_CPU_PCT, BUSY_SHARE, LAG_P99_S = 85.0, 0.2, 0.02
# After the last response, before the closing scrape: the server updates its metrics as it
# sends the last chunk, so a short wait is enough to find the last request counted.
FINAL_SCRAPE_DELAY_S = 0.2
# Steal time worth naming as the reason a loop lagged (a vCPU paused for others stalls
# every thread on it: tens of ms at a time on a shared 2-core VM).
STEAL_PCT = 5.0


@dataclass(frozen=True)
class HttpOptions:
    url: str | None = None  # None: the launched server's (`launch`)
    api_key: str | None = None
    model: str | None = None  # None: the first model the server lists
    prompt_format: str = "auto"  # auto | ids | text
    vocab_size: int = 256  # prompt ids drawn below this: byte-range ids exist in any vocab
    scrape_period_s: float | None = 0.5  # the target's /metrics; None: off
    max_connections: int = 0  # 0: unlimited (the workload's concurrency governs)
    launch: LaunchSpec | None = None  # start this server, drive it, stop it (server_launch)
    server_profile: ServerProfileSpec | None = None  # vLLM's profiler window (server_profile)
    clients: int = 1  # > 1: the load split over client actors placed by Ray (ray_load)
    ray_address: str | None = None  # a Ray cluster for the clients (None: local)

    @property
    def sharded(self) -> bool:
        return self.clients > 1 or self.ray_address is not None

    def __post_init__(self) -> None:
        if self.clients < 1:
            raise ConfigError(f"--clients must be >= 1, got {self.clients}")
        if self.server_profile is not None:
            check_launch(self.launch)
        if self.url is None and self.launch is None:
            raise ConfigError("an HTTP run needs --target URL or --launch COMMAND")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"--target must be an http:// or https:// URL, got {self.url!r}")
        if self.scrape_period_s is not None and self.scrape_period_s < 0.05:
            raise ConfigError("the metrics scrape period must be >= 0.05 s")


class HttpRecorder(RunRecorder):
    """The client sink of an HTTP run: the request row also says what the server reported."""

    def __init__(self, writer: RunWriter, target: HttpTarget):
        super().__init__(writer)
        self._target = target

    def request_done(self, result: ClientResult) -> None:
        req = result.request
        rec = self._target.records.get(req.request_id)
        args = {"max_tokens": req.max_tokens, "offset_s": req.offset_s}
        if req.cancel_after_tokens is not None or req.cancel_after_s is not None:
            args.update(cancel_after_tokens=req.cancel_after_tokens,
                        cancel_after_s=req.cancel_after_s)  # fmt: skip
        prompt_len = req.prompt_len
        if rec is not None:
            args["http"] = {k: v for k, v in asdict(rec).items() if v not in (None, 0)}
            if rec.usage_prompt_tokens is not None:
                prompt_len = rec.usage_prompt_tokens  # the server's count (text prompts)
        self._request((req.request_id, prompt_len, result.output_tokens, None,
                       result.finish_reason, req.is_warmup, req.prefix_group,
                       result.output_digest, result.error, json.dumps(args), None))  # fmt: skip


class LoopMonitor:
    """The client's own health: event-loop lag (a timer's lateness) and the CPU use of
    the loop thread and of the whole process, per window."""

    def __init__(self, append, period_s: float = 0.01, window_s: float = 0.25):
        self._append, self.period_s, self.window_s = append, period_s, window_s
        self.lags: list[float] = []
        self.loop_cpu: list[float] = []

    async def run(self) -> None:
        self._start()
        while True:
            due = time.monotonic() + self.period_s
            await asyncio.sleep(self.period_s)
            now = time.monotonic()
            lag = max(0.0, now - due)
            self.lags.append(lag)
            self._window_lag = max(self._window_lag, lag)
            if now - self._wall0 >= self.window_s:
                self.flush()

    def _start(self) -> None:
        self._machine0 = _machine_cpu()
        self._cpu0, self._proc0 = time.thread_time(), time.process_time()
        self._wall0 = time.monotonic()
        self._window_lag = 0.0

    def flush(self) -> None:
        """Write the window so far (called from the loop thread: thread_time is its CPU)."""
        if not hasattr(self, "_wall0"):
            return
        now, loop_cpu, proc = time.monotonic(), time.thread_time(), time.process_time()
        wall = max(now - self._wall0, 1e-9)
        ts = time.monotonic_ns()
        loop_pct = 100.0 * (loop_cpu - self._cpu0) / wall
        self.loop_cpu.append(loop_pct)
        self._append(("client_loop_lag_max_s", ts, self._window_lag, "client"))
        self._append(("client_loop_cpu_pct", ts, loop_pct, "client"))
        self._append(("client_process_cpu_pct", ts, 100.0 * (proc - self._proc0) / wall, "client"))
        self._cpu0, self._proc0, self._wall0, self._window_lag = loop_cpu, proc, now, 0.0

    def summary(self) -> dict:
        lags = np.asarray(self.lags or [0.0])
        cpu = np.asarray(self.loop_cpu or [0.0])
        busy_share = float((cpu >= BUSY_CPU_PCT).mean())
        lag_p99 = float(np.percentile(lags, 99))
        reasons = []
        if busy_share >= BUSY_SHARE:
            reasons.append(f"event-loop thread >= {BUSY_CPU_PCT:.0f}% CPU in "
                           f"{busy_share:.0%} of windows")  # fmt: skip
        steal = steal_pct(getattr(self, "_machine0", None), _machine_cpu())
        if lag_p99 >= LAG_P99_S:
            why = ""
            if busy_share < BUSY_SHARE and steal is not None and steal >= STEAL_PCT:
                why = f" while the hypervisor took {steal:.0f}% of the machine's CPU time"
            reasons.append(f"event-loop lag p99 {lag_p99 * 1e3:.1f} ms{why}")
        return {
            "loop_lag_p50_ms": float(np.percentile(lags, 50)) * 1e3,
            "loop_lag_p99_ms": lag_p99 * 1e3,
            "loop_lag_max_ms": float(lags.max()) * 1e3,
            "loop_cpu_pct_mean": float(cpu.mean()),
            "loop_cpu_pct_max": float(cpu.max()),
            "host_steal_pct": steal,
            "client_bound": bool(reasons),
            "busy": busy_share >= BUSY_SHARE,  # bound by its own work, not only delayed
            "reasons": reasons,
        }


def _machine_cpu():
    try:
        import psutil

        return psutil.cpu_times()
    except Exception:  # no psutil or no /proc: steal is simply not reported
        return None


def steal_pct(before, after) -> float | None:
    """The share of the machine's CPU time the hypervisor gave to others in between."""
    if before is None or after is None or not hasattr(after, "steal"):
        return None
    total = sum(after) - sum(before)
    return 100.0 * (after.steal - before.steal) / total if total > 0 else None


def record_http_run(options: RunOptions, out_dir: Path, command: list[str] | None = None,
                    on_progress: ProgressCallback | None = None, progress_interval_s: float = 0.25,
                    *, http: HttpOptions,
                    on_launched: Callable[[LaunchedServer], None] | None = None,
                    ) -> SessionResult:  # fmt: skip
    """Like `session.record_run` (same call), against `http.url` instead of an engine.
    With `http.launch` the server is started first (its log kept in the run as
    server/server.log, `on_launched` told once it is healthy) and stopped at the end,
    whatever happens: done, failed, Ctrl-C or SIGTERM. With `http.clients` > 1 or a Ray
    address, the load is split over client actors (probes/ray_load.py)."""
    if http.sharded:  # only then is Ray imported
        from .ray_load import record_sharded_run

        return record_sharded_run(options, out_dir, command, on_progress, progress_interval_s,
                                  http=http)  # fmt: skip
    out_dir = Path(out_dir)
    launch = http.launch
    created = _claim_directory(out_dir)
    planned = server = profiler = None
    try:
        planned = plan(options.workload, http.vocab_size)
        progress = Progress(total=len(planned))
        if launch is not None:
            started = launch
            if http.server_profile is not None:  # vLLM started with its profiler on
                profiler = ServerProfiler(http.server_profile, out_dir)
                started = profiler.launch_spec(launch)
            server = launch_for_run(started, out_dir)
            if on_launched is not None:
                on_launched(server)
        status = asyncio.run(_main(options, http, planned, out_dir, command, progress,
                                   on_progress, progress_interval_s, server,
                                   profiler))  # fmt: skip
    except BaseException:
        # Nothing recorded yet (bad target, unreachable, a server that did not start):
        # leave no half-made run behind.
        if created and not any(out_dir.iterdir()):
            with contextlib.suppress(OSError):
                out_dir.rmdir()
        raise
    finally:
        if server is not None:
            server.stop()  # at once when `_main` stopped it
        if profiler is not None:
            profiler.discard()  # the traces of a run that never took them in
    return SessionResult(out_dir, status, progress)


async def _main(options, http, planned, out_dir, command, progress, on_progress, interval,
                server=None, profiler=None):  # fmt: skip
    writer = scraper = None
    target = HttpTarget(server.url if server is not None else http.url, api_key=http.api_key,
                        model=http.model, prompt_format=http.prompt_format,
                        max_connections=http.max_connections)  # fmt: skip
    info = await target.open()
    status, tasks = CRASHED, []
    try:
        longest = planned.longest()
        if info.max_model_len is not None and longest > info.max_model_len:
            raise ConfigError(f"the workload asks for up to {longest} tokens per request but "
                              f"the target's context is {info.max_model_len}")  # fmt: skip
        # What the run recorded is the server's, not engine_ref's: no engine options (nor
        # the engine's probes), and what the server says of itself.
        recorded = {k: v for k, v in options.to_dict().items() if k not in ("engine", "probes")}
        facts = await server_facts(target.session, target.url, target._headers())
        kind = server_kind(server.argv) if server is not None else "unknown"
        launched = None if server is None else launch_record(server, http.launch, RUN_LOG)
        described = {"kind": kind if kind != "unknown" else kind_from_models(facts["models"]),
                     **facts, "launch": launched}  # fmt: skip
        if profiler is not None:  # launch.argv stays the user's (a relaunch starts it)
            described["launch"] = profiler.unflagged(launched)
            described["profile"] = profiler.record()
        writer = RunWriter(out_dir, command=list(sys.argv if command is None else command),
                           config={"run_options": recorded,
                                   "target": asdict(info) | {"api_key": None},
                                   "server": described},
                           environment_info=environment.fingerprint())  # fmt: skip
        if server is not None:
            server.move_log(out_dir / RUN_LOG)  # the log is part of the run
        loop, main = asyncio.get_running_loop(), asyncio.current_task()
        writer.on_failure(lambda: loop.call_soon_threadsafe(main.cancel))  # stop writing now
        recorder = HttpRecorder(writer, target)
        target.on_event = recorder.client_event
        counters = writer.table("counters").append
        monitor = LoopMonitor(counters)
        tasks.append(asyncio.create_task(monitor.run()))
        if http.scrape_period_s:
            scraper = MetricsScraper(target.session, f"{target.url}/metrics", counters,
                                     http.scrape_period_s, target._headers())  # fmt: skip
            # One scrape before the first request and one after the last (below): the
            # server's counters then bracket the whole run, whatever the period.
            if await scraper.scrape_once():
                tasks.append(asyncio.create_task(scraper.run(first_after=http.scrape_period_s)))
            else:
                scraper = None
        if on_progress is not None:
            tasks.append(asyncio.create_task(_report(progress, on_progress, interval)))
        try:
            if profiler is not None:
                profiler.begin(target.session, target.url, target._headers())
            await drive(planned, target, recorder, options.workload.arrival, progress,
                        keep_token_ids=False)  # fmt: skip
            if profiler is not None:
                await profiler.end()  # the workload ended: the window too
            if scraper is not None:
                await asyncio.sleep(FINAL_SCRAPE_DELAY_S)  # the server books the last request
                await scraper.scrape_once()
            status = COMPLETE
        except (KeyboardInterrupt, asyncio.CancelledError):
            status = INTERRUPTED
            raise
        finally:
            monitor.flush()  # the last, partial window
            writer.update_manifest(extra={**writer.manifest.extra,
                                          "client_health": monitor.summary(),
                                          "client_pid": os.getpid()})  # fmt: skip
    finally:
        if profiler is not None:  # stopped, and its traces written, while the server runs
            await profiler.end()
            await profiler.wait_written(WAIT_S if status == COMPLETE else INTERRUPTED_WAIT_S,
                                        expected_workers(server.argv))  # fmt: skip
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if on_progress is not None:
            on_progress(progress)
        await target.close()
        if server is not None:
            server.stop()  # before the run closes: its exit code and whole log are in it
        if writer is not None:
            described = dict(writer.manifest.config.get("server") or {})
            if server is not None and described.get("launch"):
                described["launch"] = {**described["launch"], "exit_code": server.exit_code}
            if scraper is not None and scraper.info:
                described["info"] = scraper.info  # vllm:cache_config_info and the like
            try:
                if profiler is not None:  # the traces into the run, imported
                    profiler.collect(writer.manifest.command, writer.manifest.clock)
            finally:
                if profiler is not None:
                    described["profile"] = profiler.record()
                writer.update_manifest(config={**writer.manifest.config, "server": described})
                writer.close(status)
            if writer.failure is not None:
                raise writer.failure_error()
    return status
