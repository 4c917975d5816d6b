"""Overlapped scheduling's hidden host time: the CUDA-event rule (async_step._ForwardTimer)
on stand-in events here, and on a real GPU (gpu mark) the look-ahead recorded as hidden
while outputs stay the plain engine's."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from perfdiag.engine_ref import LLMEngine, RecordingObserver
from perfdiag.engine_ref.async_step import _ForwardTimer
from perfdiag.engine_ref.hooks import StepPhase
from perfdiag.engine_ref.testing import run, tiny_config, workload


class _Event:
    def __init__(self, done: bool, ms: float = 0.0):
        self.done, self.ms = done, ms

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, other) -> float:
        return other.ms


def _timer(done: bool, device_ms: float = 0.0) -> _ForwardTimer:
    t = _ForwardTimer(torch.device("cpu"))
    t.events = (_Event(True), _Event(done, device_ms))
    return t


def test_hidden_time_from_the_forward_events():
    assert _ForwardTimer(torch.device("cpu")).hidden_ns(0, 100, 900) == 0  # CPU: none
    assert _timer(done=False).hidden_ns(0, 100, 900) == 800  # device still busy: all of it
    # Done by now: hidden up to forward start + device time (0 + 0.5 ms), from launch (100).
    assert _timer(done=True, device_ms=0.0005).hidden_ns(0, 100, 900) == 400
    assert _timer(done=True, device_ms=0.00001).hidden_ns(0, 100, 900) == 0
    assert _timer(done=True, device_ms=1.0).hidden_ns(0, 100, 900) == 800


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_look_ahead_is_hidden_and_outputs_identical():
    cfg = replace(tiny_config(max_model_len=128), device="cuda")
    items = workload(n=24, seed=0)
    plain = run(LLMEngine(cfg), items)
    obs = RecordingObserver()
    overlapped = run(LLMEngine(replace(cfg, async_scheduling=True), obs), items)
    assert overlapped.tokens == plain.tokens
    hidden = [p for p in obs.phases if p.phase == StepPhase.HOST_HIDDEN]
    assert hidden, "the look-ahead never ran while the GPU computed"
