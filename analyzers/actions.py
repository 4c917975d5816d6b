"""Advice as data: the concrete change a finding's first recommendation asks for.

A check's advice names the knob, its value now and a value to try, with the effect the
run's models predict. When that change is one `perfdiag run` can make (an engine or a
workload option), it is also an `Action`, so `perfdiag analyze RUN --verify-advice` can
re-run the run with it (`--like` semantics: everything else kept; a server perfdiag
launched is relaunched with its flag changed) and say whether the
metric it targets improved beyond noise (analyzers/compare.py). An action of kind
"environment" (a quieter machine) or "code" (move work off the event loop) cannot be
applied by a re-run; it is still shown, and verifying it says so.
"""

from __future__ import annotations

from dataclasses import dataclass

# Run options an action may change: (section, field) → the `perfdiag run` flag.
FLAGS = {
    ("engine", "chunk_size"): "--chunk-size",
    ("engine", "max_batched_tokens"): "--max-batched-tokens",
    ("engine", "max_seqs"): "--max-seqs",
    ("engine", "kv_blocks"): "--kv-blocks",
    ("engine", "kv_cache_mb"): "--kv-cache-mb",
    ("engine", "prefix_cache"): "--prefix-cache",
    ("engine", "policy"): "--policy",
    ("engine", "max_wait_ms"): "--max-wait-ms",
    ("engine", "preemption"): "--preemption",
    ("engine", "router"): "--router",
    ("engine", "expert_placement"): "--expert-placement",
    ("engine", "speculative"): "--speculative",
    ("engine", "kv_dtype"): "--kv-dtype",
    ("engine", "async_scheduling"): "--async-scheduling",
    ("engine", "kv_offload_mb"): "--kv-offload-mb",
    ("engine", "pp_microbatches"): "--pp-microbatches",
    ("engine", "pp_layers"): "--pp-layers",
    ("workload", "concurrency"): "--concurrency",
    ("workload", "rate"): "--rate",
    # A server perfdiag launched (`perfdiag run --launch`): its own flags (vLLM's names),
    # applied by relaunching it with the flag changed.
    ("server", "max_num_seqs"): "--max-num-seqs",
    ("server", "max_num_batched_tokens"): "--max-num-batched-tokens",
    ("server", "enable_prefix_caching"): "--enable-prefix-caching",
    ("server", "num_gpu_blocks_override"): "--num-gpu-blocks-override",
}
KINDS = ("run", "environment", "code")


@dataclass(frozen=True)
class Setting:
    option: str  # "engine.chunk_size", "workload.concurrency" (keys of FLAGS, dotted)
    now: object  # the value the run had (None: off / not set)
    to: object  # the value to try

    @property
    def flag(self) -> str:
        section, name = self.option.split(".", 1)
        flag = FLAGS[(section, name)]
        if isinstance(self.to, bool):  # a switch: --prefix-cache / --no-prefix-cache
            return flag if self.to else flag.replace("--", "--no-", 1)
        return f"{flag} {self.to:g}" if isinstance(self.to, float) else f"{flag} {self.to}"


@dataclass(frozen=True)
class Action:
    kind: str  # run | environment | code
    target: str  # the metric it should improve: a compare metric key (ttft.p50, itl.p99, …)
    settings: tuple[Setting, ...] = ()  # kind "run": the options to change
    expect: str = ""  # the predicted effect, in words
    how: str = ""  # kinds "environment" and "code": what to do instead of a re-run

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"action kind {self.kind!r} not in {KINDS}")
        for s in self.settings:
            if tuple(s.option.split(".", 1)) not in FLAGS:
                raise ValueError(f"no run flag for {s.option!r}")

    @property
    def flags(self) -> str:
        """The `perfdiag run` options that apply it ("" when no re-run can)."""
        return " ".join(s.flag for s in self.settings)

    @property
    def relaunches(self) -> bool:
        """Applied by relaunching the server with its flags changed (server settings)."""
        return any(s.option.startswith("server.") for s in self.settings)

    def command(self, run_path: str) -> str:
        if not self.settings:
            return ""
        if self.relaunches:  # the launch command with the flag changed
            return f"perfdiag analyze {run_path} --verify-advice (relaunches with {self.flags})"
        return f"perfdiag run --like {run_path} {self.flags}"


def run_action(target: str, *settings: Setting, expect: str = "") -> Action:
    return Action("run", target, tuple(settings), expect)


def other_action(kind: str, target: str, how: str) -> Action:
    return Action(kind, target, (), how=how)
