"""A recording session: the reference engine under a workload, with probes, into a run.

Order matters for "nothing half-written claims to be complete": the output directory is
claimed first (so an unwritable path fails at once), the engine and workload are checked
next (an impossible configuration fails before any run exists, and the claimed directory
is removed), and only then is the run opened. From there every exit closes it: complete,
interrupted (Ctrl-C) or crashed (an exception), keeping everything recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..traces import environment
from ..traces.manifest import COMPLETE, CRASHED, INTERRUPTED
from ..traces.writer import RunWriter
from .client import Progress, drive
from .cuda_timing import make_step_timer
from .device_sampler import DeviceSampler
from .faults import FaultOptions, rank_fault
from .gc_probe import GcProbe
from .profiler_window import ProfilerWindow
from .recorder import RunRecorder
from .replicas import attach, check_supported, torch_threads
from .run_options import RunOptions
from .targets import EngineTarget
from .workload import Plan, plan
from .workload_fit import fit_to_context

ProgressCallback = Callable[[Progress], None]


@dataclass
class SessionResult:
    path: Path
    status: str
    progress: Progress


def record_run(
    options: RunOptions,
    out_dir: Path,
    command: list[str] | None = None,
    on_progress: ProgressCallback | None = None,
    progress_interval_s: float = 0.25,
    faults: FaultOptions | None = None,
) -> SessionResult:
    """`faults` (diagnosis experiments only) slow named parts of the engine for real;
    the manifest's `config.faults` says so."""
    out_dir = Path(out_dir)
    created = _claim_directory(out_dir)
    engine = None
    replicas: list = []  # data parallelism: every replica's engine (engine is replica 0)
    dp = options.engine.dp
    try:
        check_supported(options)
        while len(replicas) < dp:
            replicas.append(_build_engine(options))
        engine = replicas[0]
        # A built-in workload's lengths are capped to the model's context (workload_fit.py).
        workload, fit = fit_to_context(options.workload, engine.config.max_model_len)
        options = dataclasses.replace(options, workload=workload)
        planned = plan(options.workload, engine.config.model.vocab_size)
        check_workload_fits(planned, engine)
        fitted = fit.record(planned) if fit.changed else None
        rank_pids = [os.getpid(), *(engine.tp.pids if engine.tp is not None else ())]
        if faults is not None:
            faults.check_ranks(len(rank_pids))
        writer = RunWriter(
            out_dir,
            command=list(sys.argv if command is None else command),
            config={
                "run_options": options.to_dict(),
                **({"workload_fit": fitted} if fitted else {}),
                "engine_config": dataclasses.asdict(engine.config),
                "num_kv_blocks": engine.block_manager.num_blocks,
                **({"faults": faults.to_dict()} if faults is not None and faults.active else {}),
                **({"parallel": engine.tp.info()} if engine.tp is not None else {}),
                **(
                    {"data_parallel": {"size": dp, "router": options.engine.router}}
                    if dp > 1
                    else {}
                ),
            },
            environment_info=environment.fingerprint(deep=True),
        )  # a full disk: it leaves the directory as it found it
    except BaseException:
        for e in replicas:
            e.close()
        if created:
            with contextlib.suppress(OSError):
                out_dir.rmdir()
        raise
    status = CRASHED
    sampler = window = triton_probe = gc_probe = None
    try:
        gc_probe = GcProbe(writer.table("spans").append).attach()
        if options.probes.profile_steps is not None:
            first, last = options.probes.profile_steps
            window = ProfilerWindow(first, last, options.engine.device, out_dir)
        step_timer = make_step_timer(options.engine.device, options.probes.nvtx)
        # The launch probe follows one stepping thread: not several replicas.
        kernels = engine.config.resolved_kernel_backend if dp == 1 else None
        if options.probes.triton_launches and kernels == "triton":
            from .triton_probe import TritonProbe

            triton_probe = TritonProbe(
                writer.table("spans").append, options.engine.device, step_timer=step_timer
            ).attach()
            step_timer = triton_probe  # it wraps the CUDA timer: launches know their step
        recorder = RunRecorder(
            writer,
            rank=0 if engine.tp is not None else None,
            step_timer=step_timer,
            window=window,
            decode=engine.tokenizer.decode if options.probes.record_text else None,
        )
        engine.observer = faults.wrap(recorder) if faults is not None else recorder
        if faults is not None:
            faults.slow_proposer(engine)
            faults.slow_restore(engine)
            faults.slow_scheduler(engine)
        sink = engine.observer
        if dp > 1:  # a recorder per replica, step ids unique across them
            sink = attach(replicas, lambda i: RunRecorder(
                writer, step_timer=make_step_timer(options.engine.device, options.probes.nvtx),
                decode=engine.tokenizer.decode if options.probes.record_text else None, replica=i,
            ), faults.wrap if faults is not None else None)  # fmt: skip
        if options.probes.device_sampling:
            workers = tuple(engine.tp.pids) if engine.tp is not None else ()
            sampler = DeviceSampler(
                writer.table("counters").append, options.probes.sample_period_s,
                worker_pids=workers,
            ).start()  # fmt: skip
        progress = Progress(total=len(planned))
        with rank_fault(faults, rank_pids):
            asyncio.run(_drive(replicas, sink, planned, options, progress, on_progress,
                               progress_interval_s, writer))  # fmt: skip
        status = COMPLETE
    except KeyboardInterrupt:
        status = INTERRUPTED
        raise
    except asyncio.CancelledError:  # the writer stopped the run (see _drive)
        if writer.failure is None:
            raise
    finally:
        try:
            for e in replicas:
                e.close()  # tensor parallelism: workers stop, their last records land
                e.observer = None
            if gc_probe is not None:
                gc_probe.detach()
            if triton_probe is not None:
                triton_probe.detach()
                info = {**writer.manifest.extra, "triton_probe": triton_probe.summary()}
                writer.update_manifest(extra=info)
            if sampler is not None:
                sampler.stop()
            if window is not None:
                try:
                    info = window.finish(writer, writer.manifest.clock)
                except (OSError, RuntimeError) as e:  # say, no room for the raw trace
                    info = {"captured_steps": None, "reason": f"the trace was not kept: {e}"}
                writer.update_manifest(extra={**writer.manifest.extra, "profiler_window": info})
        finally:  # a second Ctrl-C while the probes stop still closes the run
            writer.close(status)
    if writer.failure is not None:
        raise writer.failure_error()
    return SessionResult(out_dir, status, progress)


async def _drive(replicas, sink, planned, options, progress, on_progress, interval_s,
                 writer) -> None:  # fmt: skip
    from ..engine_ref import AsyncLLMEngine
    from ..engine_ref.replicas import AsyncReplicas
    from ..engine_ref.router import Router, RouterPolicy

    # A failed write stops the run now, as Ctrl-C would, instead of recording into memory.
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    writer.on_failure(lambda: loop.call_soon_threadsafe(task.cancel))

    router = None
    if len(replicas) == 1:
        engine_target = EngineTarget(AsyncLLMEngine(replicas[0]))
    else:
        router = Router(RouterPolicy.parse(options.engine.router), len(replicas))
        engine_target = EngineTarget(AsyncReplicas(replicas, router, sink.on_route))
    reporter = None
    if on_progress is not None:
        reporter = asyncio.create_task(_report(progress, on_progress, interval_s))
    threads = torch_threads(len(replicas)) if router else contextlib.nullcontext()
    per_replica = None
    try:
        with threads as per_replica:
            async with engine_target.engine:
                await drive(planned, engine_target, sink, options.workload.arrival, progress,
                            keep_token_ids=options.probes.record_text)  # fmt: skip
    finally:
        if router is not None:
            info = {**router.summary(), "torch_threads_per_replica": per_replica}
            writer.update_manifest(extra={**writer.manifest.extra, "router": info})
        if reporter is not None:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
            on_progress(progress)


async def _report(progress: Progress, on_progress: ProgressCallback, interval_s: float) -> None:
    while True:
        on_progress(progress)
        await asyncio.sleep(interval_s)


def _claim_directory(out_dir: Path) -> bool:
    """Create the run directory now so a bad path fails before any work. Returns whether
    this call created it (and so may remove it if the run never starts)."""
    if out_dir.exists():
        if not out_dir.is_dir() or any(out_dir.iterdir()):
            raise ConfigError(f"{out_dir}: already exists and is not an empty directory")
        return False
    try:
        out_dir.mkdir(parents=True)
    except OSError as e:
        raise ConfigError(f"{out_dir}: cannot create the run directory ({e.strerror})") from None
    return True


def _build_engine(options: RunOptions):
    from ..engine_ref import LLMEngine

    return LLMEngine(options.engine.engine_config())


def check_workload_fits(planned: Plan, engine) -> None:
    """Refuse a workload the engine can never serve, before recording anything."""
    max_len = engine.config.max_model_len
    need = planned.longest()
    if need > max_len:
        raise ConfigError(
            f"the workload asks for up to {need} tokens per request (prompt + output) but the "
            f"model's context is {max_len}: shorten --prompt-len / --output-len"
        )
    bm = engine.block_manager
    usable = bm.num_blocks - engine.watermark_blocks
    if bm.blocks_for(need) > usable:
        raise ConfigError(
            f"the KV pool ({bm.num_blocks} blocks of {bm.block_size} tokens) cannot hold one "
            f"request of {need} tokens: raise --kv-cache-mb / --kv-blocks or shorten requests"
        )
