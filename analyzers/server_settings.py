"""A served run's server settings, as the server's launch and its own metrics state them,
and the names each server gives its knobs (so advice is written in the server's terms).

The manifest's `server` section (probes/http_session.py) holds `kind`, `launch.args` (the
launch command's flags, `--max-num-seqs 2` → `max_num_seqs: 2`), `launch.env` and `info`
(info metrics' labels, e.g. `vllm:cache_config_info`). A setting read from neither is None:
never a guessed default.
"""

from __future__ import annotations

from dataclasses import dataclass

# What perfdiag calls a setting → (launch flag keys that set it, cache_config_info label).
_SOURCES = {
    "max_num_seqs": (("max_num_seqs", "max_running_requests", "parallel", "np"), None),
    "max_num_batched_tokens": (("max_num_batched_tokens", "chunked_prefill_size"), None),
    "enable_prefix_caching": (("enable_prefix_caching",), "enable_prefix_caching"),
    "block_size": (("block_size", "page_size"), "block_size"),
    "num_blocks": (("num_gpu_blocks_override",), "num_gpu_blocks"),
    "kv_cache_memory_bytes": (("kv_cache_memory_bytes",), "kv_cache_memory_bytes"),
    "kv_cache_max_concurrency": ((), "kv_cache_max_concurrency"),
    "long_prefill_token_threshold": (("long_prefill_token_threshold",), None),
}
# Each server's name for a knob (None: it has no such knob).
KNOBS = {
    "vllm": {
        "max_num_seqs": "--max-num-seqs",
        "max_num_batched_tokens": "--max-num-batched-tokens",
        "enable_prefix_caching": "--enable-prefix-caching",
        "long_prefill_token_threshold": "--long-prefill-token-threshold",
        "kv_gpu": "--gpu-memory-utilization (or --kv-cache-memory-bytes)",
        "kv_cpu": "VLLM_CPU_KVCACHE_SPACE (GiB, environment)",
        "num_blocks": "--num-gpu-blocks-override",
    },
    "sglang": {
        "max_num_seqs": "--max-running-requests",
        "max_num_batched_tokens": "--chunked-prefill-size",
        "enable_prefix_caching": "the radix cache (drop --disable-radix-cache)",
        "kv_gpu": "--mem-fraction-static",
    },
    "llamacpp": {
        "max_num_seqs": "--parallel",
        "max_num_batched_tokens": "--batch-size",
        "enable_prefix_caching": "--cache-reuse",
        "kv_cpu": "--ctx-size",
        "kv_gpu": "--ctx-size",
    },
    "perfdiag": {
        "max_num_seqs": "--max-seqs",
        "max_num_batched_tokens": "--max-batched-tokens",
        "enable_prefix_caching": "--prefix-cache",
        "kv_cpu": "--kv-cache-mb",
        "kv_gpu": "--kv-cache-mb",
    },
}


def driven_server(config: dict) -> dict:
    """The `server` section of a run that drove a server (`perfdiag run --target/--launch`:
    it has a `kind`); {} otherwise — `perfdiag serve`'s own run also has a `server` section,
    its HTTP settings beside its engine_config: that is an engine run."""
    server = (config or {}).get("server")
    if not isinstance(server, dict) or "engine_config" in (config or {}) or "kind" not in server:
        return {}
    return server


def _parse(value):
    """Info-metric labels are text: "True", "364", "0.92", "None"."""
    if not isinstance(value, str):
        return value
    low = value.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null", ""):
        return None
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


@dataclass(frozen=True)
class ServerSettings:
    kind: str  # vllm | sglang | llamacpp | perfdiag | unknown
    launched: bool  # perfdiag launched it: its arguments are known
    args: dict
    env: dict
    info: dict  # every info metric's labels, merged

    @classmethod
    def of(cls, config: dict, metrics_server: str | None = None) -> ServerSettings:
        server = driven_server(config)
        launch = server.get("launch") if isinstance(server.get("launch"), dict) else {}
        info: dict = {}
        for labels in (server.get("info") or {}).values():
            if isinstance(labels, dict):
                info.update(labels)
        kind = server.get("kind") or metrics_server or "unknown"
        if kind == "unknown" and metrics_server:
            kind = metrics_server
        return cls(kind, bool(launch), dict(launch.get("args") or {}),
                   dict(launch.get("env") or {}), info)  # fmt: skip

    def get(self, setting: str):
        """The setting's value from the launch arguments, else the server's info metrics;
        None when neither states it."""
        flags, label = _SOURCES[setting]
        for key in flags:
            if key in self.args:
                return _parse(self.args[key])
        if label is not None and label in self.info:
            return _parse(self.info[label])
        return None

    def source(self, setting: str) -> str:
        flags, label = _SOURCES[setting]
        if any(k in self.args for k in flags):
            return "launch arguments"
        if label is not None and label in self.info:
            return "the server's info metrics"
        return "not recorded"

    def knob(self, name: str) -> str | None:
        return KNOBS.get(self.kind, KNOBS["vllm"] if self.kind == "unknown" else {}).get(name)

    def kv_knob(self, on_gpu: bool) -> str | None:
        """The knob that sizes the KV cache: the CPU build's, or the GPU one."""
        cpu = self.knob("kv_cpu")
        if cpu is not None and (not on_gpu or "VLLM_CPU_KVCACHE_SPACE" in self.env):
            return cpu
        return self.knob("kv_gpu") or cpu
