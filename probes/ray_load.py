"""Distributed load: `perfdiag run --target URL --clients N [--ray ADDRESS]` (issue 40).

The driver (this process) plans the workload once, splits it over N client actors that
Ray places with the SPREAD strategy (one per node while nodes last), and measures each
actor's monotonic clock against its own (probes/clock_align.py) before the run and after.
It picks one start instant, told to each actor on that actor's clock, so all shards follow
the one schedule. Each actor records its share with the single-client code
(probes/ray_shard.py) into a part on its node and returns the part's files; the driver
keeps every part under `parts/shard{k}/` of the run and merges them into the run itself
(traces/run_merge.py): the tables of a single client's run, each request's shard in its
args, timestamps on the driver's clock, the alignment's uncertainty in the manifest
(`client_shards`, checked by the gate's clock check) and the client's health per shard
(probes/shard_health.py).

An actor that dies (killed, its node lost) is a missing shard: the run keeps the others,
is marked interrupted, and says which shard is missing and why. Ctrl-C stops every shard;
what each recorded is kept. Ray is imported only here, and only this path imports it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..errors import ConfigError
from ..ray_reach import unreachable
from ..traces.writer import RunWriter
from .client import Progress
from .clock_align import ClockAlignment, estimate_offset
from .http_session import HttpOptions
from .run_options import RunOptions
from .session import ProgressCallback, SessionResult, _claim_directory
from .shard_plan import split_plan
from .workload import plan

PARTS_DIR = "parts"
PLACE_TIMEOUT_S = 120.0  # actors placed and answering (a real cluster may start workers)
START_LEAD_S = 0.2  # from telling the (ready) shards the start instant to the start
STOP_WAIT_S = 30.0  # after Ctrl-C, for the shards to close their parts
CLOCK_TIMEOUT_S = 10.0


def record_sharded_run(options: RunOptions, out_dir: Path, command: list[str] | None = None,
                       on_progress: ProgressCallback | None = None,
                       progress_interval_s: float = 0.25, *, http: HttpOptions,
                       on_actors: Callable[[list], None] | None = None,
                       ) -> SessionResult:  # fmt: skip
    """Like `http_session.record_http_run` (same call) with the load split over
    `http.clients` Ray actors. `on_actors` is told the actor handles once they run (tests
    kill one)."""
    if http.launch is not None:
        raise ConfigError("--clients/--ray drive a running server (--target URL): --launch "
                          "starts one on this machine only")  # fmt: skip
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "--clients N > 1 and --ray need Ray: pip install 'perfdiag[ray]'"
        ) from None
    out_dir = Path(out_dir)
    command = ["perfdiag", "run"] if command is None else list(command)
    created = _claim_directory(out_dir)
    inited = False
    try:
        planned = list(plan(options.workload, http.vocab_size))
        shares = split_plan(planned, options.workload.arrival, http.clients)
        inited = _connect(ray, http.ray_address)
        actors, places = _place(ray, http.clients)
        if on_actors is not None:
            on_actors(actors)
        result = _run(ray, actors, places, shares, options, http, out_dir, command,
                      on_progress, progress_interval_s)  # fmt: skip
    except BaseException:
        if created and out_dir.exists() and not any(out_dir.iterdir()):
            with contextlib.suppress(OSError):
                out_dir.rmdir()
        raise
    finally:
        if inited:
            ray.shutdown()
    return result


def _connect(ray, address: str | None) -> bool:
    """Join the cluster at `address` (None: a local one, started here); whether this call
    connected (and so disconnects at the end)."""
    if ray.is_initialized():
        return False
    if (e := unreachable(address)) is not None:  # ray.init would retry it for minutes
        raise ConfigError(f"cannot reach the Ray cluster at {address}: "
                          f"{e.strerror or type(e).__name__}")  # fmt: skip
    main = threading.current_thread() is threading.main_thread()
    term = signal.getsignal(signal.SIGTERM) if main else None
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False,
                 configure_logging=False)  # fmt: skip
    except Exception as e:  # ConnectionError, a bad address, a refused token, …
        where = f"at {address}" if address else "locally"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"cannot start or join a Ray cluster {where}: {first}") from None
    finally:
        if main and term is not None:
            # ray.init makes SIGTERM exit the process at once; perfdiag's handler turns it
            # into an interrupt that stops the shards and keeps what they recorded.
            signal.signal(signal.SIGTERM, term)
    return True


def _place(ray, n: int):
    """N client actors, spread over the cluster's nodes; (actors, where each runs)."""
    from .ray_shard import ShardActor

    cpus = float(ray.cluster_resources().get("CPU", 0.0))
    # One CPU each where the cluster has them (the SPREAD strategy then puts one per
    # node); a share of what there is otherwise, so N clients still start.
    each = min(1.0, cpus / n) if cpus else 0.0
    cls = ray.remote(num_cpus=each, max_concurrency=4, scheduling_strategy="SPREAD")(ShardActor)
    actors = [cls.remote() for _ in range(n)]
    try:
        places = ray.get([a.where.remote() for a in actors], timeout=PLACE_TIMEOUT_S)
    except Exception as e:
        for a in actors:
            with contextlib.suppress(Exception):
                ray.kill(a)
        raise ConfigError(
            f"{n} client actors were not placed within {PLACE_TIMEOUT_S:.0f} s "
            f"(the cluster has {cpus:g} CPUs): {type(e).__name__}"
        ) from None
    return actors, places


def _align(ray, actor) -> object:
    return estimate_offset(lambda: ray.get(actor.now_ns.remote(), timeout=CLOCK_TIMEOUT_S))


def _run(ray, actors, places, shares, options, http, out_dir, command, on_progress, interval):
    n = len(actors)
    recorded = {k: v for k, v in options.to_dict().items() if k not in ("engine", "probes")}
    writer = RunWriter(out_dir, command=command, config={"run_options": recorded})
    shard_http = replace(http, clients=1, ray_address=None)
    refs = [actor.record.remote(options, shard_http, _job(share, n), command)
            for share, actor in zip(shares, actors, strict=True)]  # fmt: skip
    # Every shard set up before any starts; then the clocks, then one start instant.
    ready = ray.get([a.wait_ready.remote(PLACE_TIMEOUT_S) for a in actors])
    starts = [_align(ray, a) if ok else None for a, ok in zip(actors, ready, strict=True)]
    start_ns = time.monotonic_ns() + int(START_LEAD_S * 1e9)
    for actor, start in zip(actors, starts, strict=True):
        if start is not None:
            actor.start.remote(start_ns + start.offset_ns)
    interrupted = False
    try:
        _wait(ray, actors, refs, on_progress, interval, sum(len(s.planned) for s in shares))
    except KeyboardInterrupt:
        interrupted = True
        for a in actors:
            with contextlib.suppress(Exception):
                a.stop.remote()
        ray.wait(refs, num_returns=len(refs), timeout=STOP_WAIT_S)
    outcomes = []
    for ref in refs:
        try:
            outcomes.append(ray.get(ref, timeout=1.0))
        except Exception as e:  # the actor died, or its recording failed
            outcomes.append({"error": _why(e)})
    alignments = []
    for k, actor in enumerate(actors):
        end = None
        if "error" not in outcomes[k] and starts[k] is not None:
            with contextlib.suppress(Exception):
                end = _align(ray, actor)
        alignments.append(None if starts[k] is None else ClockAlignment(starts[k], end))
    for a in actors:
        with contextlib.suppress(Exception):
            ray.kill(a)
    from .ray_merge import finish_run

    status, progress = finish_run(writer, out_dir / PARTS_DIR, outcomes, alignments, places,
                                  shares, http, interrupted)  # fmt: skip
    if on_progress is not None:
        on_progress(progress)
    if interrupted:
        raise KeyboardInterrupt
    return SessionResult(out_dir, status, progress)


def _job(share, shards):
    from .ray_shard import ShardJob

    return ShardJob(share.shard, shards, share.planned, share.concurrency,
                    scrape=share.shard == 0)  # fmt: skip


def _wait(ray, actors, refs, on_progress, interval, total) -> None:
    pending = list(refs)
    while pending:
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=interval)
        if on_progress is not None and pending:
            on_progress(_progress(ray, actors, total))


def _progress(ray, actors, total) -> Progress:
    p = Progress(total=total)
    for a in actors:
        with contextlib.suppress(Exception):
            _, sent, done, failed, cancelled, tokens = ray.get(a.progress.remote(), timeout=0.2)
            p.sent, p.done, p.failed = p.sent + sent, p.done + done, p.failed + failed
            p.cancelled, p.output_tokens = p.cancelled + cancelled, p.output_tokens + tokens
    return p


def _why(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    # A failed task's own exception is its message's last line; a dead actor's, the first.
    first = (lines[-1] if "Task" in type(e).__name__ else lines[0]) if lines else ""
    return f"{type(e).__name__}: {first}"[:300]
