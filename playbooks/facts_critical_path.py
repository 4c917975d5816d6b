"""The critical path of a traced run as a fact: what the path is made of and which op,
shortened, would save the most (analyzers/critical_path.py replays the trace's graph)."""

from __future__ import annotations

import pandas as pd

from ..analyzers.names import short_name as _short
from .facts import Fact, TriageContext, Unavailable, ev, fact, share

_VERB = {"halved": "halving", "removed": "removing"}
# What to do about the heaviest item, by its kind on the path.
_ADVICE = {
    "kernel": "Make {name} faster or fuse it with its neighbours (torch.compile, a tuned "
    "kernel, lower precision): it runs on the path {pieces} times.",
    "memcpy": "Take {name} off the path: pinned memory and non_blocking copies on a side "
    "stream, or no per-step host round trip.",
    "memset": "Avoid the per-step {name} (reuse zeroed buffers, allocate outside the step).",
    "comm": "Overlap {name} with compute (bucketed/async collectives) or shrink what it moves.",
    "cpu": "Take {name} off the launch path: the GPU waits for it. Batch it, move it to "
    "another thread, or capture the step in a CUDA graph.",
    "cuda_api": "Call {name} less often (it is on the path {pieces} times): cache "
    "allocations and streams, capture launches in a CUDA graph.",
    "launch": "Launches are on the path: capture the step in a CUDA graph "
    '(torch.compile mode="reduce-overhead") so one launch replaces many.',
    "gpu_gap": "Kernels wait on each other ({name}): fuse the short ones (torch.compile) "
    "or use a CUDA graph to cut the kernel-to-kernel gaps.",
    "sync": "Remove the synchronisation {name} from the step (.item(), .cpu(), .tolist(), "
    "blocking copies): the host waits for the GPU there.",
    "copy_wait": "{name} makes the host wait for the GPU (a copy to or from pageable memory, "
    "or a synchronous copy): copy into pinned memory with non_blocking=True and synchronise "
    "once, where the result is needed.",
    "host_gap": "The host runs untraced work between ops ({name}: Python, waits): "
    "profile it with a Python sampler (py-spy) or with_stack=True.",
    "thread_wait": "A thread waits for another ({name}): overlap them or split the work.",
}


@fact(
    "critical_path",
    provides=("path_ms", "steps", "bound", "bound_share", "host", "gpu", "launch",
              "kernel_gaps", "sync", "comm", "top_kind", "top_name", "top_share",
              "what_if", "lever", "saved_ms", "others", "advice"),
)  # fmt: skip
def critical_path(ctx: TriageContext) -> Fact | Unavailable:
    """Share of the traced time the biggest lever on the critical path would save: the
    path through CPU ops, launches, kernels, copies and syncs, and for its heaviest ops a
    replay of the trace with each halved (a sync removed)."""
    cp = ctx.critical_path
    if cp is None or not len(cp.segments):
        return Unavailable("the run has no GPU work in its spans (a CUDA profiler window)")
    path = float(cp.ranks["path_ns"].sum())
    steps = int(cp.ranks["windows"].sum())
    bound = cp.bound()
    tried = cp.items[cp.items["saved_ns"].notna()]
    if not len(tried):
        return Unavailable("no op on the critical path can be shortened in a replay")
    best = tried.loc[tried["saved_ns"].astype("float64").idxmax()]
    others = tried.drop(index=best.name).sort_values("saved_ns", ascending=False).head(2)
    saved = float(best["saved_ns"])

    def of(*bounds: str) -> float:
        return share(float(sum(bound.get(b, 0) for b in bounds)), path)

    kind = "copy_wait" if best["kind"] == "sync" and "Memcpy" in str(best["name"]) else best["kind"]
    advice = _ADVICE.get(kind, "").format(name=_short(best["name"]), pieces=best["pieces"])
    evidence = (
        ev("path_ms", "critical path", path / 1e6, "ms"),
        ev("steps", "steps", steps),
        ev("bound", "mostly", str(bound.index[0])),
        ev("bound_share", "of the path", share(float(bound.iloc[0]), path), "%"),
        ev("host", "host (CPU ops, API calls, gaps)", of("host"), "%"),
        ev("gpu", "GPU work (kernels, copies)", of("gpu compute", "gpu copy"), "%"),
        ev("launch", "launch overhead", of("launch overhead"), "%"),
        ev("kernel_gaps", "kernel-to-kernel", of("kernel-to-kernel"), "%"),
        ev("sync", "synchronisation", of("synchronisation"), "%"),
        ev("comm", "communication", of("communication"), "%"),
        ev("top_kind", "biggest lever: kind", str(best["kind"])),
        ev("top_name", "biggest lever", _short(best["name"])),
        ev("top_share", "its time on the path", float(best["share"]), "%"),
        ev("what_if", "if", f"{best['what_if']}"),
        ev("lever", "lever", f"{_VERB[best['what_if']]} {_short(best['name'])}"),
        ev("saved_ms", "saves per step", saved / max(steps, 1) / 1e6, "ms"),
        ev("others", "next levers", _others(others, steps)),
        ev("advice", "advice", advice),
    )
    value = share(saved, path)
    return Fact(value, evidence, impact=value)


def _others(rows: pd.DataFrame, steps: int) -> str:
    return "; ".join(
        f"{_short(r['name'], 40)} ({r['kind']}) {r['what_if']}: "
        f"{float(r['saved_ns']) / max(steps, 1) / 1e6:.3f} ms/step"
        for _, r in rows.iterrows()
    )
