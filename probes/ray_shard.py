"""One client shard of a distributed `perfdiag run --target URL --clients N`: its share of
the workload recorded into a run part, with the same client, target and recorder as a
single-client HTTP run (probes/http_session.py). Runs inside a Ray actor (probes/ray_load.py)
but imports no Ray: the part is an ordinary run directory on the actor's node.

What differs from the single client: the schedule starts at a time the driver chose (on
this process's clock), so every shard's offsets share one origin; only the shard asked to
scrapes the target's /metrics (one series in the merged run); the loop-health counters are
scoped `client/shard{k}`; and the shard can be stopped from another thread (Ctrl-C at the
driver), closing its part as interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..traces import environment
from ..traces.manifest import COMPLETE, CRASHED, INTERRUPTED
from ..traces.writer import RunWriter
from .client import Progress, drive
from .http_session import FINAL_SCRAPE_DELAY_S, HttpOptions, HttpRecorder, LoopMonitor
from .http_target import HttpTarget
from .metrics_scrape import MetricsScraper
from .run_options import RunOptions
from .server_args import kind_from_models
from .server_launch import server_facts
from .workload import PlannedRequest

SHARD_SCOPE = "client/shard{}"  # the loop-health counters' scope in a sharded run


@dataclass(frozen=True)
class ShardJob:
    shard: int
    shards: int
    planned: list[PlannedRequest]  # this shard's requests, offsets on the run's schedule
    concurrency: int | None  # closed loop: its clients; open loop: its cap (None: none)
    scrape: bool  # this shard scrapes the target's /metrics


class ShardRecorder:
    """Records one shard in two phases: `record` sets everything up (target, run part,
    monitors), says so (`wait_ready`) and waits for `start(ns)`, the instant the schedule
    starts on this process's clock; every shard is ready before any starts, so no shard's
    set-up competes for CPU with another's sends. `progress`, `wait_ready`, `start` and
    `stop` are called from other threads."""

    def __init__(self) -> None:
        self.progress = Progress(total=0)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task | None = None
        self._go: asyncio.Future | None = None
        self._ready = threading.Event()  # set up (or ended: failed before starting)
        self._stopped = threading.Event()

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether the shard is set up and waiting for its start."""
        return self._ready.wait(timeout_s) and self._go is not None

    def start(self, start_ns: int) -> None:
        loop, go = self._loop, self._go
        if loop is not None and go is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(lambda: go.done() or go.set_result(start_ns))

    def stop(self) -> None:
        self._stopped.set()
        loop, main = self._loop, self._main
        if loop is not None and main is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(main.cancel)

    def record(self, options: RunOptions, http: HttpOptions, job: ShardJob, out_dir: Path,
               command: list[str]) -> dict:  # fmt: skip
        """Record the shard into `out_dir`; its status and health (never raises for a
        stop: the part is closed as interrupted)."""
        self.progress = Progress(total=len(job.planned))
        # A Ray worker holds far more long-lived objects than a plain client (Ray's own
        # modules): a full collection then pauses the loop for tens of ms. Frozen, they
        # are never scanned again; what the run allocates is collected as usual.
        gc.collect()
        gc.freeze()
        try:
            return asyncio.run(self._run(options, http, job, Path(out_dir), command))
        finally:
            gc.unfreeze()

    async def _run(self, options, http, job, out_dir, command) -> dict:
        self._loop, self._main = asyncio.get_running_loop(), asyncio.current_task()
        if self._stopped.is_set():
            raise asyncio.CancelledError
        try:
            return await _record(options, http, job, out_dir, command, self.progress, self)
        except asyncio.CancelledError:
            return {"status": INTERRUPTED, "health": None}
        finally:
            self._ready.set()  # a shard that failed to set up is "ready" to be found out

    async def _started(self) -> int:
        self._go = self._loop.create_future()
        self._ready.set()
        return await self._go


async def _record(options, http, job: ShardJob, out_dir: Path, command, progress, phases) -> dict:
    target = HttpTarget(http.url, api_key=http.api_key, model=http.model,
                        prompt_format=http.prompt_format,
                        max_connections=http.max_connections)  # fmt: skip
    info = await target.open()
    writer = scraper = None
    status, tasks, health = CRASHED, [], None
    try:
        recorded = {k: v for k, v in options.to_dict().items() if k not in ("engine", "probes")}
        facts = await server_facts(target.session, target.url, target._headers())
        described = {"kind": kind_from_models(facts["models"]), **facts, "launch": None}
        writer = RunWriter(out_dir, command=command,
                           config={"run_options": recorded,
                                   "target": asdict(info) | {"api_key": None},
                                   "server": described},
                           environment_info=environment.fingerprint())  # fmt: skip
        loop, main = asyncio.get_running_loop(), asyncio.current_task()
        writer.on_failure(lambda: loop.call_soon_threadsafe(main.cancel))
        recorder = HttpRecorder(writer, target)
        target.on_event = recorder.client_event
        append = writer.table("counters").append
        scope = SHARD_SCOPE.format(job.shard)
        monitor = LoopMonitor(lambda row: append((*row[:3], scope)))
        tasks.append(asyncio.create_task(monitor.run()))
        if job.scrape and http.scrape_period_s:
            scraper = MetricsScraper(target.session, f"{target.url}/metrics", append,
                                     http.scrape_period_s, target._headers())  # fmt: skip
            if await scraper.scrape_once():
                tasks.append(asyncio.create_task(scraper.run(first_after=http.scrape_period_s)))
            else:
                scraper = None
        arrival = options.workload.arrival
        arrival = replace(arrival, concurrency=job.concurrency)
        try:
            # Every shard's schedule starts at the same instant (the driver's choice), so
            # the merged sends follow the one schedule the workload planned.
            start_ns = await phases._started()
            await asyncio.sleep(max(0, start_ns - time.monotonic_ns()) / 1e9)
            await drive(job.planned, target, recorder, arrival, progress, keep_token_ids=False)
            if scraper is not None:
                await asyncio.sleep(FINAL_SCRAPE_DELAY_S)
                await scraper.scrape_once()
            status = COMPLETE
        except (KeyboardInterrupt, asyncio.CancelledError):
            status = INTERRUPTED
            raise
        finally:
            monitor.flush()
            health = {**monitor.summary(), **_lateness(progress)}
            writer.update_manifest(extra={**writer.manifest.extra, "client_health": health,
                                          "client_pid": os.getpid(),
                                          "client_shard": job.shard})  # fmt: skip
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await target.close()
        if writer is not None:
            if scraper is not None and scraper.info:
                server = {**writer.manifest.config.get("server", {}), "info": scraper.info}
                writer.update_manifest(config={**writer.manifest.config, "server": server})
            writer.close(status)
    return {"status": status, "health": health}


def _lateness(progress: Progress) -> dict:
    """The largest lateness of a send against its schedule (the driver computes the
    percentiles from the merged events)."""
    return {"send_lateness_max_ms": progress.max_lateness_ns / 1e6}


class ShardActor:
    """The body of a client actor (probes/ray_load.py wraps it with `ray.remote`). Its part
    is recorded in a temporary directory on the actor's node and returned, files and all,
    to the driver: no shared filesystem is needed."""

    def __init__(self) -> None:
        self._recorder = ShardRecorder()

    def where(self) -> dict:
        import socket

        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(),
                "host": socket.gethostname(), "pid": os.getpid()}  # fmt: skip

    def now_ns(self) -> int:
        return time.monotonic_ns()

    def progress(self) -> tuple[int, ...]:
        p = self._recorder.progress
        return (p.total, p.sent, p.done, p.failed, p.cancelled, p.output_tokens)

    def stop(self) -> None:
        self._recorder.stop()

    def wait_ready(self, timeout_s: float) -> bool:
        return self._recorder.wait_ready(timeout_s)

    def start(self, start_ns: int) -> None:
        self._recorder.start(start_ns)

    def record(self, options, http, job: ShardJob, command: list[str]) -> dict:
        import shutil
        import tempfile

        tmp = Path(tempfile.mkdtemp(prefix=f"perfdiag-shard{job.shard}-"))
        try:
            summary = self._recorder.record(options, http, job, tmp / "part", command)
            return {**summary, "files": read_part(tmp / "part")}
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def read_part(path: Path) -> dict[str, bytes]:
    """A closed run part's files by relative path (its lock file left out)."""
    if not path.is_dir():
        return {}
    return {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*"))
            if f.is_file() and not f.name.startswith(".")}  # fmt: skip
