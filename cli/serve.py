"""`perfdiag serve`: the reference engine behind an OpenAI-compatible HTTP API, recording a
run of everything it serves (unless --no-record)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Annotated

import typer

from .app import app, out

SERVER = "Server"
ENGINE = "Engine"


def _opt(*names: str, panel: str, help: str, **kw):
    return typer.Option(*names, rich_help_panel=panel, help=help, show_default=False, **kw)


@app.command()
def serve(
    host: Annotated[
        str, _opt("--host", panel=SERVER, help="Address to bind [127.0.0.1: this machine only].")
    ] = "127.0.0.1",
    port: Annotated[
        int, _opt("--port", panel=SERVER, help="Port (0: any free one) [8000].", min=0, max=65535)
    ] = 8000,
    api_key: Annotated[
        str | None,
        _opt(
            "--api-key",
            panel=SERVER,
            envvar="PERFDIAG_API_KEY",
            help="Require `Authorization: Bearer KEY` on /v1/* (or $PERFDIAG_API_KEY).",
        ),
    ] = None,
    served_model_name: Annotated[
        str | None,
        _opt("--served-model-name", panel=SERVER, help="Model id in the API [preset or dir name]."),
    ] = None,
    max_waiting: Annotated[
        int,
        _opt(
            "--max-waiting",
            panel=SERVER,
            help="Waiting requests before 429 [256].",
            min=0,
            max=1_000_000,
        ),
    ] = 256,
    request_timeout: Annotated[
        float,
        _opt(
            "--request-timeout",
            panel=SERVER,
            help="Seconds per request, 0 for none [600].",
            min=0,
            max=86_400,
        ),
    ] = 600.0,
    preset: Annotated[
        str, _opt("--preset", panel=ENGINE, help="tiny, small or smollm2-135m (real) [small].")
    ] = "small",
    model_file: Annotated[
        Path | None, _opt("--model-file", panel=ENGINE, help="A GGUF file (llama models).")
    ] = None,
    weights: Annotated[
        str, _opt("--weights", panel=ENGINE, help="float, q4_1 or q8_0 (packed) [float].")
    ] = "float",
    model_dir: Annotated[
        Path | None, _opt("--model-dir", panel=ENGINE, help="A local Hugging Face checkpoint.")
    ] = None,
    device: Annotated[str, _opt("--device", panel=ENGINE, help="cpu or cuda[:N] [cpu].")] = "cpu",
    dtype: Annotated[str | None, _opt("--dtype", panel=ENGINE, help="float32, bfloat16…")] = None,
    kv_cache_mb: Annotated[
        float, _opt("--kv-cache-mb", panel=ENGINE, help="KV pool size in MiB [256].")
    ] = 256.0,
    kv_blocks: Annotated[
        int | None, _opt("--kv-blocks", panel=ENGINE, help="KV pool size in blocks.")
    ] = None,
    kv_dtype: Annotated[
        str, _opt("--kv-dtype", panel=ENGINE, help="KV storage: auto, int8 or fp8 [auto].")
    ] = "auto",
    kv_offload_mb: Annotated[
        float,
        _opt("--kv-offload-mb", panel=ENGINE, help="Host tier for the prefix cache, MiB [0: off]."),
    ] = 0.0,
    chunk_size: Annotated[
        int, _opt("--chunk-size", panel=ENGINE, help="Prefill chunk per request [512].")
    ] = 512,
    max_seqs: Annotated[
        int, _opt("--max-seqs", panel=ENGINE, help="Sequences per step [64].")
    ] = 64,
    max_batched_tokens: Annotated[
        int, _opt("--max-batched-tokens", panel=ENGINE, help="Token budget per step [2048].")
    ] = 2048,
    prefix_cache: Annotated[
        bool, _opt("--prefix-cache/--no-prefix-cache", panel=ENGINE, help="Prefix cache [on].")
    ] = True,
    seed: Annotated[int, _opt("--seed", panel=ENGINE, help="Sampler seed [0].")] = 0,
    speculative: Annotated[
        str | None,
        _opt(
            "--speculative",
            panel=ENGINE,
            help="Speculative decoding: ngram:K or draft:PRESET_OR_FILE:K [off].",
        ),
    ] = None,
    async_scheduling: Annotated[
        bool,
        _opt(
            "--async-scheduling",
            panel=ENGINE,
            help="Schedule and prepare step N+1 while step N's forward runs.",
        ),
    ] = False,
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Run directory [runs/RUN_ID-serve].",
            show_default=False,
        ),
    ] = None,
    no_record: Annotated[bool, typer.Option("--no-record", help="Serve without a run.")] = False,
) -> None:
    """Serve the reference engine over an OpenAI-compatible API (completions, chat, SSE)."""
    from ..engine_ref import LLMEngine
    from ..engine_ref.server import ServerConfig, serve_forever
    from ..probes.run_options import EngineOptions
    from ..traces.manifest import COMPLETE, CRASHED

    engine_options = EngineOptions(preset=preset, model_dir=str(model_dir) if model_dir else None,
                                   device=device, dtype=dtype, kv_cache_mb=kv_cache_mb,
                                   kv_blocks=kv_blocks, kv_dtype=kv_dtype, chunk_size=chunk_size,
                                   kv_offload_mb=kv_offload_mb,
                                   prefix_cache=prefix_cache, max_seqs=max_seqs,
                                   max_batched_tokens=max_batched_tokens, seed=seed,
                                   model_file=str(model_file) if model_file else None,
                                   weights=weights, speculative=speculative,
                                   async_scheduling=async_scheduling)  # fmt: skip
    default_name = model_file.stem if model_file else model_dir.name if model_dir else preset
    name = served_model_name or default_name
    config = ServerConfig(host=host, port=port, model_name=name, api_key=api_key,
                          max_waiting=max_waiting,
                          request_timeout_s=request_timeout or None)  # fmt: skip
    engine = LLMEngine(engine_options.engine_config())
    run = created = None
    if not no_record:
        from ..probes.server_probe import ServerRun
        from ..probes.session import _claim_directory
        from ..traces.writer import new_run_id

        out_dir = out_dir or Path("runs") / new_run_id("serve")  # its name is its run id
        created = _claim_directory(out_dir)
        run = ServerRun(out_dir, engine, config, ["perfdiag", *sys.argv[1:]])
    served = False

    def ready(running) -> None:
        nonlocal served
        served = True
        where = f", recording into {out_dir}" if run is not None else ""
        out.print(f"perfdiag serve: {name} on {engine_options.device} at {running.url}{where}",
                  highlight=False, soft_wrap=True)  # fmt: skip
        sys.stdout.flush()  # a supervising process waits for this line

    status = CRASHED
    try:
        serve_forever(engine, config, run.recorder if run else None,
                      run.run_id if run else None, on_ready=ready)  # fmt: skip
        status = COMPLETE  # SIGINT / SIGTERM: a clean shutdown
    finally:
        if run is not None:
            run.close(status)
            if not served and created:  # it never listened (port taken): no run to keep
                shutil.rmtree(out_dir, ignore_errors=True)
            else:
                out.print(f"run: {out_dir} ({status})", highlight=False)
