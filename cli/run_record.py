"""`perfdiag run` at work: the run recorded with live progress, an interrupt turned into a
kept run and an exit code, then the summary a user reads first."""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path

import typer
from rich.live import Live
from rich.table import Table

from .app import out
from .signals import sigterm_as_interrupt


def default_out_dir(workload_name: str) -> Path:
    from ..traces.writer import new_run_id

    return Path("runs") / new_run_id(Path(workload_name).stem)  # its name is its run id


def record(options, out_dir: Path, quiet: bool, http=None) -> None:
    from ..probes.session import record_run

    started = time.monotonic()
    e, w = options.engine, options.workload
    if e.device == "cpu" and e.kernel_backend == "triton":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
    model = e.model_file or e.model_dir or e.preset
    if e.weights != "float":
        model = f"{model}, weights {e.weights},"
    where = f"{model} on {e.device} ({e.resolved_dtype})"
    if e.tp > 1:
        where += f", tensor parallel {e.tp} (gloo)" if e.device == "cpu" else f", TP {e.tp}"
    if e.dp > 1:
        where += f", {e.dp} data-parallel replicas ({e.router} router)"
    if e.expert_bias:  # a deliberate skew: say so where the run starts
        where += f", router bias {e.expert_bias}"
    if http is not None:  # an HTTP server instead of the in-process engine
        from ..probes.http_session import record_http_run
        from ..probes.server_launch import RUN_LOG

        record_run, where = functools.partial(record_http_run, http=http), http.url
        if http.sharded:  # the load split over client actors (docs/ray.md)
            n = http.clients
            where += f" from {n} client{'s' * (n > 1)} on Ray ({http.ray_address or 'local'})"
        if http.launch is not None:
            where = f"launching `{http.launch.command}` (log: {out_dir / RUN_LOG})"

            def launched(server) -> None:
                nonlocal started
                started = time.monotonic()  # the workload's time starts now
                out.print(f"server healthy at {server.url} after {server.startup_s:.1f} s "
                          f"(pid {server.pid})", highlight=False)  # fmt: skip

            record_run = functools.partial(record_run, on_launched=launched)
    label = f"replay of {w.replay}" if w.replay else f"workload {w.name}"
    out.print(f"perfdiag run: {where}, {label} "
              f"({w.requests} requests), into {out_dir}", highlight=False)  # fmt: skip
    live = None if quiet else Live(console=out, refresh_per_second=4, transient=True)

    def show(p) -> None:
        if live is not None:
            elapsed = time.monotonic() - started
            live.update(_progress_table(p, elapsed))

    with sigterm_as_interrupt() as term:
        try:
            if live is not None:
                live.start()
            result = record_run(options, out_dir, command=["perfdiag", *sys.argv[1:]],
                                on_progress=show)  # fmt: skip
        except KeyboardInterrupt:
            if live is not None:
                live.stop()
            how = "terminated" if term.received else "interrupted"
            if (out_dir / "manifest.json").exists():
                out.print(f"[yellow]{how}[/]: everything recorded is kept in {out_dir}")
            else:  # stopped while the engine was being built: no run was opened
                out.print(f"[yellow]{how}[/] before the run started: nothing was recorded")
            raise typer.Exit(143 if term.received else 130) from None
        finally:
            if live is not None:
                live.stop()
    _print_fitted(result.path)
    _print_summary(result.path)
    if http is not None:  # a client-bound run measures the client: say so
        from ..traces.manifest import read_manifest

        manifest = read_manifest(result.path)
        launched = (manifest.config.get("server") or {}).get("launch")
        if isinstance(launched, dict):
            out.print(f"server stopped (exit code {launched.get('exit_code')}); its log: "
                      f"{result.path / launched.get('log', '')}", highlight=False)  # fmt: skip
        _print_server_profile(result.path, (manifest.config.get("server") or {}).get("profile"))
        from rich.markup import escape

        shards = manifest.extra.get("client_shards") or {}
        for k, why in (shards.get("missing") or {}).items():  # a client actor that died
            out.print(f"[yellow]warning[/]: client shard {k} of {shards.get('count')} is "
                      f"missing ({escape(why)}): its requests are not in the run",
                      highlight=False)  # fmt: skip
        health = manifest.extra.get("client_health") or {}
        if health.get("client_bound"):
            reasons = "; ".join(health.get("reasons", []))
            what = (
                "the load client was the bottleneck"
                if health.get("busy", True)
                else "the load client's event loop was delayed: its timings include the delay"
            )
            out.print(f"[yellow]warning[/]: {what} ({reasons})")


def _print_fitted(path: Path) -> None:
    """A built-in workload's requests shortened to the model's context (the manifest keeps
    the caps even when no request reached one: probes/workload_fit.py)."""
    from ..traces.manifest import read_manifest

    fit = read_manifest(path).config.get("workload_fit")
    if isinstance(fit, dict) and fit.get("at_cap"):
        out.print(f"[yellow]warning[/]: {fit.get('note')}", highlight=False)


def _print_server_profile(path: Path, profile) -> None:
    """Where vLLM's profiler traces went, and what went wrong with them."""
    if not isinstance(profile, dict):
        return
    if profile.get("trace_run"):
        steps = (profile.get("alignment") or {}).get("steps")
        out.print(f"vLLM's profiler: {len(profile.get('files') or [])} files in "
                  f"{path / (profile.get('dir') or '')}, the worker trace imported as "
                  f"{path / profile['trace_run']} ({steps} steps; perfdiag timeline "
                  f"{path / profile['trace_run']})", highlight=False)  # fmt: skip
    from rich.markup import escape

    for warning in profile.get("warnings") or []:
        out.print(f"[yellow]warning[/]: vLLM's profiler: {escape(warning)}", highlight=False)


def _progress_table(p, elapsed: float) -> Table:
    t = Table.grid(padding=(0, 2))
    rate = p.output_tokens / elapsed if elapsed > 0 else 0.0
    t.add_row(
        f"requests {p.done}/{p.total}",
        f"in flight {p.in_flight}",
        f"failed {p.failed}",
        f"cancelled {p.cancelled}",
        f"{rate:.1f} tok/s",
        f"elapsed {elapsed:.1f} s",
    )
    return t


def _print_summary(path: Path) -> None:
    from ..analyzers.lifecycle import Missing, build_lifecycle
    from ..analyzers.metrics import serving_metrics
    from ..analyzers.steady_state import find_window
    from ..traces.reader import load_run

    r = load_run(path)
    lc = build_lifecycle(r)
    if isinstance(lc, Missing):
        out.print(f"run: {path} (no requests recorded)")
        return
    w = find_window(lc.requests, lc.origin_ns)
    m = serving_metrics(lc, w)
    o, tp = m.outcomes, m.throughput
    span = "steady state" if w.steady else "whole run"
    t = Table(title=f"run {r.manifest.run_id} ({r.status})", title_justify="left")
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("requests (completed / failed / cancelled)",
              f"{o.ok} / {o.error + o.rejected} / {o.cancelled + o.timeout}")  # fmt: skip
    t.add_row("warm-up excluded", str(o.warmup_excluded))
    t.add_row(f"window ({span})", f"{w.duration_s:.2f} s")
    t.add_row("output tokens/s (delivered)", f"{tp.output_tokens_per_s:.1f}")
    t.add_row("requests/s", f"{tp.requests_per_s:.2f}")
    ttft, itl, e2e = m.ttft_s, m.itl_per_chunk_s, m.e2e_s
    t.add_row("TTFT p50 / p99", f"{ttft.p50 * 1e3:.1f} / {ttft.p99 * 1e3:.1f} ms")
    t.add_row("ITL p50 / p99", f"{itl.p50 * 1e3:.1f} / {itl.p99 * 1e3:.1f} ms")
    t.add_row("E2E p50 / p99", f"{e2e.p50:.2f} / {e2e.p99:.2f} s")
    t.add_row("engine steps", f"{len(r.steps):,}")
    out.print(t)
    out.print(f"run: {path}  (details: perfdiag analyze {path})")
