"""Measure this machine's ceilings: dense matmul FLOP/s per dtype and copy bandwidth, on
the CPU and on each CUDA device, so rooflines use attained figures, not datasheet peaks.

Each figure is the best of repeated timings within a time budget (the best run is the
one least disturbed by other work on the machine). GPU work is timed with CUDA events
after a warm-up; CPU work with the monotonic clock. A copy moves 2 bytes per byte
copied (read + write), as a roofline counts traffic. Each device's figures record
how much CPU other processes used meanwhile (probes/cpu_load.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from ..hardware.ceilings import MEASURED, Ceilings
from .cpu_load import LoadMeter, OthersLoad

CPU_DTYPES = ("float32", "bfloat16")
GPU_DTYPES = ("float32", "tfloat32", "bfloat16", "float16")


@dataclass(frozen=True)
class CalibrationPlan:
    seconds_per_figure: float = 0.4  # time budget of each measurement
    cpu_matmul_n: int = 768
    cpu_copy_bytes: int = 64 * 2**20
    gpu_matmul_n: int = 8192
    gpu_copy_bytes: int = 2**30

    def __post_init__(self):
        if self.seconds_per_figure <= 0:
            raise ValueError("seconds_per_figure must be > 0")


def _best_rate(fn, work: float, budget_s: float, sync=None, min_reps: int = 3) -> float:
    """Work units per second of the fastest call to `fn` within the budget."""
    fn()  # warm-up: allocation, kernel selection, caches
    if sync:
        sync()
    best = float("inf")
    deadline = time.monotonic() + budget_s
    reps = 0
    while reps < min_reps or time.monotonic() < deadline:
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        best = min(best, time.perf_counter() - t0)
        reps += 1
    return work / best


def _cpu(plan: CalibrationPlan, torch) -> Ceilings:
    from ..traces.environment import cpu_model

    n = plan.cpu_matmul_n
    flops: dict[str, float] = {}
    for name in CPU_DTYPES:
        dtype = getattr(torch, name)
        try:
            a = torch.randn(n, n).to(dtype)
            b = torch.randn(n, n).to(dtype)
            flops[name] = _best_rate(lambda a=a, b=b: a @ b, 2.0 * n**3, plan.seconds_per_figure)
        except RuntimeError:  # dtype without a CPU matmul kernel here
            continue
    src = torch.ones(plan.cpu_copy_bytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    bw = _best_rate(lambda: dst.copy_(src), 2.0 * plan.cpu_copy_bytes, plan.seconds_per_figure)
    return Ceilings(
        device="cpu",
        flops_per_s=flops,
        bytes_per_s=bw,
        kind=MEASURED,
        source="perfdiag calibrate",
        details={
            "cpu_model": cpu_model(),
            "threads": torch.get_num_threads(),
            "matmul_n": n,
            "copy_bytes": plan.cpu_copy_bytes,
        },
    )


def _gpu(plan: CalibrationPlan, torch, index: int) -> Ceilings:
    dev = torch.device("cuda", index)
    name = torch.cuda.get_device_name(index)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed(fn, work: float) -> float:
        fn()
        torch.cuda.synchronize(dev)
        best = float("inf")
        deadline = time.monotonic() + plan.seconds_per_figure
        reps = 0
        while reps < 3 or time.monotonic() < deadline:
            start.record()
            fn()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
            reps += 1
        return work / best

    n = plan.gpu_matmul_n
    flops: dict[str, float] = {}
    with torch.cuda.device(dev):
        for name_ in GPU_DTYPES:
            dtype = torch.float32 if name_ == "tfloat32" else getattr(torch, name_)
            allow = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = name_ == "tfloat32"
            try:
                a = torch.randn(n, n, device=dev, dtype=dtype)
                b = torch.randn(n, n, device=dev, dtype=dtype)
                flops[name_] = timed(lambda a=a, b=b: a @ b, 2.0 * n**3)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = allow
        src = torch.ones(plan.gpu_copy_bytes // 4, device=dev)
        dst = torch.empty_like(src)
        bw = timed(lambda: dst.copy_(src), 2.0 * plan.gpu_copy_bytes)
        host = torch.ones(plan.gpu_copy_bytes // 16, pin_memory=True)
        part = src[: host.numel()]
        h2d = timed(lambda: part.copy_(host, non_blocking=True), host.numel() * 4.0)
    return Ceilings(
        device=name,
        flops_per_s=flops,
        bytes_per_s=bw,
        kind=MEASURED,
        source="perfdiag calibrate",
        details={
            "index": index,
            "matmul_n": n,
            "copy_bytes": plan.gpu_copy_bytes,
            "h2d_bytes_per_s": h2d,
        },
    )


def calibrate(plan: CalibrationPlan | None = None, *, gpus: bool = True) -> list[Ceilings]:
    """Measure the CPU and (when present and asked for) every CUDA device."""
    import torch

    plan = plan or CalibrationPlan()
    out = [_metered(_cpu, plan, torch)]
    if gpus and torch.cuda.is_available():
        out += [_metered(_gpu, plan, torch, i) for i in range(torch.cuda.device_count())]
    return out


def _metered(measure, *args) -> Ceilings:
    """The figures with what other processes took of the CPU meanwhile
    (details["others_load"], probes/cpu_load.py): a busy machine makes them low."""
    with LoadMeter() as meter:
        got = measure(*args)
    return replace(got, details={**got.details, "others_load": meter.result.to_dict()})


def others_load(ceilings: Ceilings) -> OthersLoad | None:
    """What other processes used while `ceilings` were measured (None: not recorded)."""
    d = ceilings.details.get("others_load")
    return OthersLoad.from_dict(d) if isinstance(d, dict) else None
