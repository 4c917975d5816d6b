"""GPU time per engine step from CUDA events, and NVTX ranges around steps.

Both exist only on CUDA; on the CPU `make_step_timer` returns None and nothing runs.
The engine's sample phase copies tokens to the host, so when a step ends its GPU work has
finished: reading the end event then costs no extra synchronisation.
"""

from __future__ import annotations


class CudaStepTimer:
    def __init__(self, device: str, nvtx: bool = True):
        import torch

        self._torch = torch
        self._device = torch.device(device)
        self._start = torch.cuda.Event(enable_timing=True)
        self._end = torch.cuda.Event(enable_timing=True)
        self._nvtx = nvtx
        self._open = False

    def begin(self, step_id: int) -> None:
        stream = self._torch.cuda.current_stream(self._device)
        self._start.record(stream)
        if self._nvtx:
            self._torch.cuda.nvtx.range_push(f"perfdiag step {step_id}")
        self._open = True

    def end(self) -> int | None:
        if not self._open:
            return None
        self._open = False
        if self._nvtx:
            self._torch.cuda.nvtx.range_pop()
        self._end.record(self._torch.cuda.current_stream(self._device))
        self._end.synchronize()
        return round(self._start.elapsed_time(self._end) * 1e6)  # ms → ns


def make_step_timer(device: str, nvtx: bool = True) -> CudaStepTimer | None:
    """A timer for CUDA devices; None on the CPU (no GPU time to measure)."""
    if not device.startswith("cuda"):
        return None
    return CudaStepTimer(device, nvtx)
