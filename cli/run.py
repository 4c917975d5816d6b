"""`perfdiag run`: the reference engine under a workload, with probes, into a new run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..engine_ref.preset_names import preset_help
from ..probes.run_flag_options import build_options
from ..probes.run_flags import ENGINE, PROBES, TARGET, WORKLOAD
from .app import app
from .run_checks import check_before_engine
from .run_record import default_out_dir, record


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
    kv_dtype: Annotated[
        str | None,
        _opt(
            "--kv-dtype",
            panel=ENGINE,
            help="KV-cache storage: auto (the model dtype), int8 or fp8 (e4m3), with one scale "
            "per token and KV head: more blocks in the same --kv-cache-mb [auto].",
        ),
    ] = None,
    kv_offload_mb: Annotated[
        float | None,
        _opt(
            "--kv-offload-mb",
            panel=ENGINE,
            help="Host memory for the prefix cache's second tier: blocks the device pool "
            "evicts are kept there and restored by copy on a hit [0: off].",
        ),
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
    pp: Annotated[
        int | None,
        _opt(
            "--pp",
            panel=ENGINE,
            help="Pipeline stages: consecutive layers per process, micro-batches overlapped "
            "across them, gloo on the CPU, NCCL on CUDA [1].",
        ),
    ] = None,
    pp_microbatches: Annotated[
        int | None,
        _opt(
            "--pp-microbatches",
            panel=ENGINE,
            help="Micro-batches each step's batch is cut into for --pp (whole requests each) "
            "[as many as stages].",
        ),
    ] = None,
    pp_layers: Annotated[
        str | None,
        _opt(
            "--pp-layers",
            panel=ENGINE,
            help="Layers per --pp stage, e.g. 3,5 [as even as possible].",
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
    speculative: Annotated[
        str | None,
        _opt(
            "--speculative",
            panel=ENGINE,
            help="Speculative decoding: ngram:K (prompt lookup) or draft:PRESET_OR_FILE:K (a "
            "draft model sharing the tokenizer), K draft tokens per step in 1..16 [off].",
        ),
    ] = None,
    async_scheduling: Annotated[
        bool,
        _opt(
            "--async-scheduling",
            panel=ENGINE,
            help="Overlapped scheduling: schedule and prepare step N+1 while step N's forward "
            "runs (vLLM's flag of the same name; SGLang's overlap scheduler).",
        ),
    ] = False,
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
    clients: Annotated[
        int | None,
        _opt(
            "--clients",
            panel=TARGET,
            help="With --target: split the load over N client processes placed by Ray (spread "
            "over its nodes), merged into one run (docs/ray.md) [1: this process, no Ray].",
        ),
    ] = None,
    ray: Annotated[
        str | None,
        _opt(
            "--ray-address",
            "--ray",
            panel=TARGET,
            help="With --target: the Ray cluster (HOST:PORT, or auto) that runs the clients "
            "[a local one, started for the run]; the same flag as perfdiag import's.",
        ),
    ] = None,
) -> None:
    """Run the reference engine under a workload with probes attached, into a new run."""
    flags = dict(locals())
    options, http = build_options(flags)
    if http is None:  # a target or a launched server: no engine here
        check_before_engine(options)
    record(options, out_dir or default_out_dir(options.workload.name), quiet, http)
