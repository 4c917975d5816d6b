"""RunOptions (and the HTTP target, if any) from `perfdiag run`'s flags: the mapping the
CLI, `perfdiag sweep` and `perfdiag capacity` share, so a sweep's point is exactly the run
its flags would make. The flags themselves are probes/run_flags.py's table."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..errors import ConfigError
from .run_flags import run_flag_defaults


def build_options(flags: dict):
    """RunOptions (and the HTTP target, if any) from run flags by parameter name
    (probes/run_flags.py); a flag left out or None is "not given"."""
    from . import run_options as ro
    from .workload import CancelSpec, LengthSpec, PrefixSpec
    from .workload_library import DEFAULT_WORKLOAD, load_workload, override

    g = {**run_flag_defaults(), **flags}.get
    like, workload = g("like"), g("workload")
    base = like_options(like) if like else ro.RunOptions(workload=load_workload(DEFAULT_WORKLOAD))
    model_dir, model_file = g("model_dir"), g("model_file")
    engine_changes = {
        "preset": g("preset"), "model_dir": str(model_dir) if model_dir else None,
        "device": g("device"), "dtype": g("dtype"), "kv_cache_mb": g("kv_cache_mb"),
        "kv_blocks": g("kv_blocks"), "kv_dtype": g("kv_dtype"), "block_size": g("block_size"),
        "kv_offload_mb": g("kv_offload_mb"),
        "chunk_size": g("chunk_size"), "prefix_cache": g("prefix_cache"),
        "max_seqs": g("max_seqs"), "max_batched_tokens": g("max_batched_tokens"),
        "preemption": g("preemption"), "policy": g("policy"), "max_wait_ms": g("max_wait_ms"),
        "seed": g("seed"), "kernel_backend": g("kernel_backend"),
        "cuda_graphs": True if g("cuda_graphs") else None, "model_seed": g("model_seed"),
        "weights": g("weights"), "model_file": str(model_file) if model_file else None,
        "tp": g("tp"), "pp": g("pp"), "pp_microbatches": g("pp_microbatches"),
        "pp_layers": g("pp_layers"), "dp": g("dp"), "router": g("router"),
        "expert_bias": g("expert_bias"),
        "expert_placement": g("expert_placement"), "speculative": g("speculative"),
        "async_scheduling": True if g("async_scheduling") else None,
    }  # fmt: skip
    engine_changes = {k: v for k, v in engine_changes.items() if v is not None}
    if g("no_chunked_prefill"):
        engine_changes["chunk_size"] = None
    engine = dataclasses.replace(base.engine, **engine_changes)

    if not workload and not like and real_model(engine):
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
        shared_prefix=parse_prefix(shared_prefix, PrefixSpec) if shared_prefix else None,
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
    clients, ray = g("clients"), g("ray")
    if ray is not None and not ray.strip():
        raise ConfigError("--ray-address is empty: give the cluster's HOST:PORT, or auto")
    if (clients is not None or ray is not None) and not g("target"):
        raise ConfigError("--clients and --ray-address need --target URL: the clients drive a "
                          "running server (a launched one is local to this machine)")  # fmt: skip
    period = g("metrics_period")
    if period is not None and not (g("target") or g("launch") is not None):
        raise ConfigError("--metrics-period needs --target or --launch")
    if period is not None and not period >= 0:  # NaN too
        raise ConfigError(f"--metrics-period must be >= 0 s (0: no scrape), got {period}")
    if g("target") or g("launch") is not None:
        from .http_session import HttpOptions
        from .server_launch import LaunchSpec

        launch = None
        if g("launch") is not None:
            timeout = g("launch_timeout")
            launch = LaunchSpec(g("launch"), **({} if timeout is None else
                                                {"startup_timeout_s": timeout}))  # fmt: skip
        window = None
        if g("server_profile") is not None:
            from .server_profile import ServerProfileSpec

            window = ServerProfileSpec.parse(g("server_profile"))
        scrape = {} if period is None else {"scrape_period_s": period or None}
        shards = {} if clients is None else {"clients": clients}
        http = HttpOptions(url=g("target"), api_key=g("api_key"), launch=launch,
                           server_profile=window, ray_address=ray or None, **scrape,
                           **shards)  # fmt: skip
    return options, http


REAL_MODEL_WORKLOAD = "chat-real"


def real_model(engine) -> bool:
    from ..engine_ref.preset_names import FILE_PRESETS  # not gguf_loader: that loads torch

    return bool(engine.model_file) or (not engine.model_dir and engine.preset in FILE_PRESETS)


def like_options(like: Path):
    from ..traces.manifest import read_manifest
    from .run_options import RunOptions

    manifest = read_manifest(like)
    recorded = manifest.config.get("run_options")
    if not isinstance(recorded, dict):
        raise ConfigError(f"{like}: not a run recorded by `perfdiag run` (no run options)")
    return RunOptions.from_dict(recorded)


def parse_prefix(text: str, prefix_spec):
    parts = text.split(":")
    try:
        if len(parts) in (2, 3):
            skew = float(parts[2]) if len(parts) == 3 else 1.0
            return prefix_spec(groups=int(parts[0]), length=int(parts[1]), skew=skew)
    except ValueError:
        pass
    raise ConfigError(f"bad --shared-prefix {text!r}: use GROUPS:LENGTH[:SKEW], e.g. 8:256:1.2")
