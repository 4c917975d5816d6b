"""`perfdiag run`: the reference engine under a workload, with probes, into a new run."""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from rich.table import Table

from ..engine_ref.preset_names import preset_help
from ..errors import ConfigError
from .app import app, out
from .run_checks import check_before_engine
from .signals import sigterm_as_interrupt

ENGINE = "Engine"
WORKLOAD = "Workload"
PROBES = "Probes"
TARGET = "Target (HTTP)"


def _opt(*names: str, panel: str, help: str, **kw):
    return typer.Option(*names, rich_help_panel=panel, help=help, show_default=False, **kw)


@app.command()
def run(
    # engine
    preset: Annotated[
        str | None,
        _opt(
            "--preset",
            panel=ENGINE,
            help=preset_help("small"),
        ),
    ] = None,
    model_dir: Annotated[
        Path | None,
        _opt(
            "--model-dir",
            panel=ENGINE,
            help="A local Hugging Face checkpoint (config.json, *.safetensors).",
        ),
    ] = None,
    model_file: Annotated[
        Path | None,
        _opt("--model-file", panel=ENGINE, help="A GGUF file (llama.cpp's format, llama models)."),
    ] = None,
    weights: Annotated[
        str | None,
        _opt(
            "--weights",
            panel=ENGINE,
            help="float, or q4_1 / q8_0: weights kept packed, dequantised in the matmul [float].",
        ),
    ] = None,
    device: Annotated[
        str | None, _opt("--device", panel=ENGINE, help="cpu or cuda[:N] [cpu].")
    ] = None,
    dtype: Annotated[
        str | None,
        _opt(
            "--dtype",
            panel=ENGINE,
            help="float32, bfloat16, float16 [float32 on cpu, bfloat16 on cuda].",
        ),
    ] = None,
    kv_cache_mb: Annotated[
        float | None, _opt("--kv-cache-mb", panel=ENGINE, help="KV pool size in MiB [256].")
    ] = None,
    kv_blocks: Annotated[
        int | None,
        _opt("--kv-blocks", panel=ENGINE, help="KV pool size in blocks (overrides --kv-cache-mb)."),
    ] = None,
    block_size: Annotated[
        int | None, _opt("--block-size", panel=ENGINE, help="Tokens per KV block [16].")
    ] = None,
    chunk_size: Annotated[
        int | None,
        _opt("--chunk-size", panel=ENGINE, help="Most prefill tokens per request per step [512]."),
    ] = None,
    no_chunked_prefill: Annotated[
        bool, _opt("--no-chunked-prefill", panel=ENGINE, help="Prefill whole prompts in one step.")
    ] = False,
    prefix_cache: Annotated[
        bool | None,
        _opt(
            "--prefix-cache/--no-prefix-cache",
            panel=ENGINE,
            help="Reuse cached prompt prefixes [on].",
        ),
    ] = None,
    max_seqs: Annotated[
        int | None, _opt("--max-seqs", panel=ENGINE, help="Most sequences per step [64].")
    ] = None,
    max_batched_tokens: Annotated[
        int | None, _opt("--max-batched-tokens", panel=ENGINE, help="Token budget per step [2048].")
    ] = None,
    preemption: Annotated[
        str | None, _opt("--preemption", panel=ENGINE, help="recompute or swap [recompute].")
    ] = None,
    policy: Annotated[
        str | None, _opt("--policy", panel=ENGINE, help="fcfs or prefix (cache-friendly) [fcfs].")
    ] = None,
    max_wait_ms: Annotated[
        float | None,
        _opt("--max-wait-ms", panel=ENGINE, help="A request waiting longer goes first [2000]."),
    ] = None,
    model_seed: Annotated[
        int | None,
        _opt("--model-seed", panel=ENGINE, help="Seed of a preset's random weights [0]."),
    ] = None,
    kernel_backend: Annotated[
        str | None,
        _opt(
            "--kernel-backend",
            panel=ENGINE,
            help="torch, triton, numba, or auto: torch on cpu, triton on cuda (on cpu Triton "
            "runs in its interpreter: slow; numba, cpu only: batch-1 decode steps fused into "
            "one compiled call, the cpu extra) [auto].",
        ),
    ] = None,
    cuda_graphs: Annotated[
        bool,
        _opt("--cuda-graphs", panel=ENGINE, help="Replay decode steps from CUDA graphs."),
    ] = False,
    tp: Annotated[
        int | None,
        _opt(
            "--tp",
            panel=ENGINE,
            help="Tensor-parallel ranks: one process each, gloo on the CPU, NCCL on CUDA [1].",
        ),
    ] = None,
    dp: Annotated[
        int | None,
        _opt(
            "--dp",
            panel=ENGINE,
            help="Data-parallel replicas: whole engines in this process, one stepping thread "
            "each, torch's threads split between them, behind --router [1].",
        ),
    ] = None,
    router: Annotated[
        str | None,
        _opt(
            "--router",
            panel=ENGINE,
            help="How requests reach the --dp replicas: round-robin, least-loaded (outstanding "
            "tokens), prefix-aware (the replica holding the prompt's prefix unless overloaded), "
            "or weighted:W1,W2,… (a fixed, load-blind split) [round-robin].",
        ),
    ] = None,
    expert_bias: Annotated[
        str | None,
        _opt(
            "--expert-bias",
            panel=ENGINE,
            help="Mixture-of-experts models: add BIAS to EXPERT's router logits, "
            "EXPERT:BIAS[,…] (e.g. 3:2.0): skewed routing, a fault for the expert checks.",
        ),
    ] = None,
    expert_placement: Annotated[
        str | None,
        _opt(
            "--expert-placement",
            panel=ENGINE,
            help="Mixture-of-experts models over --tp ranks: the rank of each expert, "
            "R0,R1,… with E/N per rank (e.g. 0,1,1,0,1,0,0,1) [contiguous].",
        ),
    ] = None,
    # workload
    workload: Annotated[
        str | None,
        _opt(
            "--workload",
            "-w",
            panel=WORKLOAD,
            help="Built-in (chat, long-prefill-mixed, shared-prefix, burst, chat-real) or a YAML "
            "file [chat; chat-real for a real model].",
        ),
    ] = None,
    requests: Annotated[
        int | None, _opt("--requests", "-n", panel=WORKLOAD, help="Number of requests.")
    ] = None,
    warmup: Annotated[
        int | None, _opt("--warmup", panel=WORKLOAD, help="Leading requests excluded from metrics.")
    ] = None,
    rate: Annotated[
        float | None, _opt("--rate", panel=WORKLOAD, help="Open loop: target requests/s.")
    ] = None,
    concurrency: Annotated[
        int | None,
        _opt(
            "--concurrency",
            "-c",
            panel=WORKLOAD,
            help="Closed loop: clients; open loop: cap on requests in flight.",
        ),
    ] = None,
    arrival: Annotated[
        str | None,
        _opt(
            "--arrival", panel=WORKLOAD, help="Open-loop inter-arrivals: constant, poisson, gamma."
        ),
    ] = None,
    burstiness: Annotated[
        float | None,
        _opt("--burstiness", panel=WORKLOAD, help="Gamma shape: 1 Poisson, < 1 burstier."),
    ] = None,
    closed: Annotated[
        bool, _opt("--closed", panel=WORKLOAD, help="Closed loop at --concurrency.")
    ] = False,
    prompt_len: Annotated[
        str | None,
        _opt(
            "--prompt-len",
            panel=WORKLOAD,
            help="N, uniform:LO:HI or lognormal:MEDIAN:SIGMA[:LO:HI].",
        ),
    ] = None,
    output_len: Annotated[
        str | None,
        _opt(
            "--output-len",
            panel=WORKLOAD,
            help="N, uniform:LO:HI or lognormal:MEDIAN:SIGMA[:LO:HI].",
        ),
    ] = None,
    shared_prefix: Annotated[
        str | None,
        _opt(
            "--shared-prefix", panel=WORKLOAD, help="GROUPS:LENGTH[:SKEW] shared prompt prefixes."
        ),
    ] = None,
    cancel_fraction: Annotated[
        float | None,
        _opt("--cancel-fraction", panel=WORKLOAD, help="Fraction of requests the client cancels."),
    ] = None,
    cancel_after_tokens: Annotated[
        int | None,
        _opt("--cancel-after-tokens", panel=WORKLOAD, help="Cancel after this many output tokens."),
    ] = None,
    cancel_after_s: Annotated[
        float | None,
        _opt("--cancel-after-s", panel=WORKLOAD, help="Cancel (time out) after this many seconds."),
    ] = None,
    replay: Annotated[
        Path | None, _opt("--replay", panel=WORKLOAD, help="JSONL file of requests to replay.")
    ] = None,
    replay_timestamps: Annotated[
        bool,
        _opt(
            "--replay-timestamps",
            panel=WORKLOAD,
            help="Send replayed requests at their timestamp_s.",
        ),
    ] = False,
    seed: Annotated[
        int | None, _opt("--seed", panel=WORKLOAD, help="Seed of the workload and the engine [0].")
    ] = None,
    # probes
    profile_steps: Annotated[
        str | None,
        _opt(
            "--profile-steps",
            panel=PROBES,
            help="torch.profiler window over engine steps FIRST:LAST.",
        ),
    ] = None,
    sample_period: Annotated[
        float | None,
        _opt("--sample-period", panel=PROBES, help="Device sampling period in seconds [0.2]."),
    ] = None,
    no_device_sampling: Annotated[
        bool, _opt("--no-device-sampling", panel=PROBES, help="Do not sample CPU/GPU counters.")
    ] = False,
    no_nvtx: Annotated[
        bool, _opt("--no-nvtx", panel=PROBES, help="No NVTX ranges around steps (CUDA).")
    ] = False,
    record_text: Annotated[
        bool,
        _opt(
            "--record-text",
            panel=PROBES,
            help="Store prompt and output text (default: digests only).",
        ),
    ] = False,
    no_triton_probe: Annotated[
        bool, _opt("--no-triton-probe", panel=PROBES, help="Do not record Triton launches.")
    ] = False,
    # output
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Run directory [runs/RUN_ID, its name the run id].",
            show_default=False,
        ),
    ] = None,
    like: Annotated[
        Path | None,
        typer.Option(
            "--like",
            help="Repeat a recorded run's engine and workload; options given override.",
            show_default=False,
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No live progress.")] = False,
    # target
    target: Annotated[
        str | None,
        _opt("--target", panel=TARGET, help="Drive this OpenAI-compatible server (no engine)."),
    ] = None,
    api_key: Annotated[
        str | None,
        _opt("--api-key", panel=TARGET, envvar="PERFDIAG_API_KEY", help="The target's key."),
    ] = None,
    launch: Annotated[
        str | None,
        _opt(
            "--launch",
            panel=TARGET,
            help="Start this server command (its own process group), wait for /health, drive "
            "it, stop it; its log is kept in the run.",
        ),
    ] = None,
    launch_timeout: Annotated[
        float | None,
        _opt(
            "--launch-timeout",
            panel=TARGET,
            help="Seconds the launched server may take to become healthy [600].",
        ),
    ] = None,
    metrics_period: Annotated[
        float | None,
        _opt(
            "--metrics-period",
            panel=TARGET,
            help="Seconds between scrapes of the server's /metrics, 0: none (the checks that "
            "read the server's own record are then not evaluated) [0.5].",
        ),
    ] = None,
    server_profile: Annotated[
        str | None,
        _opt(
            "--server-profile",
            panel=TARGET,
            help="With --launch of vLLM: its torch profiler from START to END seconds after "
            "the workload starts (END left out: to its end), START:END; the traces are kept "
            "in the run's server/profile and imported as server/trace.",
        ),
    ] = None,
) -> None:
    """Run the reference engine under a workload with probes attached, into a new run."""
    flags = dict(locals())
    options, http = build_options(flags)
    if http is None:  # a target or a launched server: no engine here
        check_before_engine(options)
    _record(options, out_dir or _default_out_dir(options.workload.name), quiet, http)


def build_options(flags: dict):
    """RunOptions (and the HTTP target, if any) from `perfdiag run`'s flags by parameter
    name; a flag left out or None is "not given". `perfdiag sweep` builds its points
    with it, so a point is exactly the run its flags would make."""
    from ..probes import run_options as ro
    from ..probes.workload import CancelSpec, LengthSpec, PrefixSpec
    from ..probes.workload_library import DEFAULT_WORKLOAD, load_workload, override

    g = {**run_flag_defaults(), **flags}.get
    like, workload = g("like"), g("workload")
    base = _like_options(like) if like else ro.RunOptions(workload=load_workload(DEFAULT_WORKLOAD))
    model_dir, model_file = g("model_dir"), g("model_file")
    engine_changes = {
        "preset": g("preset"), "model_dir": str(model_dir) if model_dir else None,
        "device": g("device"), "dtype": g("dtype"), "kv_cache_mb": g("kv_cache_mb"),
        "kv_blocks": g("kv_blocks"), "block_size": g("block_size"),
        "chunk_size": g("chunk_size"), "prefix_cache": g("prefix_cache"),
        "max_seqs": g("max_seqs"), "max_batched_tokens": g("max_batched_tokens"),
        "preemption": g("preemption"), "policy": g("policy"), "max_wait_ms": g("max_wait_ms"),
        "seed": g("seed"), "kernel_backend": g("kernel_backend"),
        "cuda_graphs": True if g("cuda_graphs") else None, "model_seed": g("model_seed"),
        "weights": g("weights"), "model_file": str(model_file) if model_file else None,
        "tp": g("tp"), "dp": g("dp"), "router": g("router"), "expert_bias": g("expert_bias"),
        "expert_placement": g("expert_placement"),
    }  # fmt: skip
    engine_changes = {k: v for k, v in engine_changes.items() if v is not None}
    if g("no_chunked_prefill"):
        engine_changes["chunk_size"] = None
    engine = dataclasses.replace(base.engine, **engine_changes)

    if not workload and not like and _real_model(engine):
        workload = REAL_MODEL_WORKLOAD  # natural prompts and EOS, not random token ids
    spec = load_workload(workload) if workload else base.workload
    cancel = None
    fraction, after_tokens, after_s = (
        g("cancel_fraction"),
        g("cancel_after_tokens"),
        g("cancel_after_s"),
    )
    if fraction is not None or after_tokens is not None or after_s is not None:
        cancel = CancelSpec(
            fraction=spec.cancel.fraction if fraction is None else fraction,
            after_tokens=after_tokens if after_tokens is not None else spec.cancel.after_tokens,
            after_s=after_s if after_s is not None else spec.cancel.after_s,
        )
    prompt_len, output_len, shared_prefix = g("prompt_len"), g("output_len"), g("shared_prefix")
    replay = g("replay")
    spec = override(
        spec,
        requests=g("requests"), warmup=g("warmup"), seed=g("seed"), rate=g("rate"),
        concurrency=g("concurrency"), process=g("arrival"), burstiness=g("burstiness"),
        mode="closed" if g("closed") else None,
        prompt_len=LengthSpec.parse(prompt_len) if prompt_len else None,
        output_len=LengthSpec.parse(output_len) if output_len else None,
        shared_prefix=_parse_prefix(shared_prefix, PrefixSpec) if shared_prefix else None,
        cancel=cancel, replay=str(replay) if replay else None,
        replay_timestamps=True if g("replay_timestamps") else None,
    )  # fmt: skip
    profile_steps = g("profile_steps")
    probe_changes = {
        "profile_steps": ro.parse_step_range(profile_steps) if profile_steps else None,
        "sample_period_s": g("sample_period"),
        "device_sampling": False if g("no_device_sampling") else None,
        "nvtx": False if g("no_nvtx") else None,
        "record_text": True if g("record_text") else None,
        "triton_launches": False if g("no_triton_probe") else None,
    }
    probes = dataclasses.replace(
        base.probes, **{k: v for k, v in probe_changes.items() if v is not None}
    )
    options = ro.RunOptions(engine=engine, workload=spec, probes=probes)
    http = None
    if g("target") and g("launch") is not None:
        raise ConfigError("--launch and --target are mutually exclusive: a launched server is "
                          "driven at its own address")  # fmt: skip
    if g("launch_timeout") is not None and g("launch") is None:
        raise ConfigError("--launch-timeout needs --launch")
    if g("server_profile") is not None and g("launch") is None:
        raise ConfigError("--server-profile needs --launch: perfdiag turns vLLM's profiler on "
                          "in the command it starts")  # fmt: skip
    period = g("metrics_period")
    if period is not None and not (g("target") or g("launch") is not None):
        raise ConfigError("--metrics-period needs --target or --launch")
    if period is not None and not period >= 0:  # NaN too
        raise ConfigError(f"--metrics-period must be >= 0 s (0: no scrape), got {period}")
    if g("target") or g("launch") is not None:
        from ..probes.http_session import HttpOptions
        from ..probes.server_launch import LaunchSpec

        launch = None
        if g("launch") is not None:
            timeout = g("launch_timeout")
            launch = LaunchSpec(g("launch"), **({} if timeout is None else
                                                {"startup_timeout_s": timeout}))  # fmt: skip
        window = None
        if g("server_profile") is not None:
            from ..probes.server_profile import ServerProfileSpec

            window = ServerProfileSpec.parse(g("server_profile"))
        scrape = {} if period is None else {"scrape_period_s": period or None}
        http = HttpOptions(url=g("target"), api_key=g("api_key"), launch=launch,
                           server_profile=window, **scrape)  # fmt: skip
    return options, http


@functools.cache
def run_flag_defaults() -> dict:
    """Every `perfdiag run` parameter with its default (None or False: not given)."""
    import inspect

    return {n: p.default for n, p in inspect.signature(run).parameters.items()}


REAL_MODEL_WORKLOAD = "chat-real"


def _real_model(engine) -> bool:
    from ..engine_ref.preset_names import FILE_PRESETS  # not gguf_loader: that loads torch

    return bool(engine.model_file) or (not engine.model_dir and engine.preset in FILE_PRESETS)


def _like_options(like: Path):
    from ..probes.run_options import RunOptions
    from ..traces.manifest import read_manifest

    manifest = read_manifest(like)
    recorded = manifest.config.get("run_options")
    if not isinstance(recorded, dict):
        raise ConfigError(f"{like}: not a run recorded by `perfdiag run` (no run options)")
    return RunOptions.from_dict(recorded)


def _parse_prefix(text: str, prefix_spec):
    parts = text.split(":")
    try:
        if len(parts) in (2, 3):
            skew = float(parts[2]) if len(parts) == 3 else 1.0
            return prefix_spec(groups=int(parts[0]), length=int(parts[1]), skew=skew)
    except ValueError:
        pass
    raise ConfigError(f"bad --shared-prefix {text!r}: use GROUPS:LENGTH[:SKEW], e.g. 8:256:1.2")


def _default_out_dir(workload_name: str) -> Path:
    from ..traces.writer import new_run_id

    return Path("runs") / new_run_id(Path(workload_name).stem)  # its name is its run id


def _record(options, out_dir: Path, quiet: bool, http=None) -> None:
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
