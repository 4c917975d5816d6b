"""Probe units: the device sampler, and (on a GPU) CUDA step timing."""

import time

import pytest

from perfdiag.errors import ConfigError
from perfdiag.probes.cuda_timing import make_step_timer
from perfdiag.probes.device_sampler import DeviceSampler


def test_sampler_writes_host_counters_on_its_cadence():
    rows = []
    sampler = DeviceSampler(rows.append, period_s=0.05).start()
    time.sleep(0.5)
    sampler.stop()
    assert 6 <= sampler.samples <= 14  # ~10 periodic samples plus the final one
    names = {r[0] for r in rows}
    assert {"cpu_util_pct", "process_cpu_pct", "process_rss_bytes"} <= names
    rss = [r[2] for r in rows if r[0] == "process_rss_bytes"]
    assert min(rss) > 10 * 2**20
    stamps = sorted({r[1] for r in rows})
    assert all(isinstance(t, int) for t in stamps)


def test_sampler_without_nvml_reports_no_gpu_rather_than_failing():
    sampler = DeviceSampler(lambda row: None, gpus=True)
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    assert (sampler.gpu_count > 0) == has_gpu


def test_sampler_refuses_a_silly_period():
    with pytest.raises(ConfigError, match="sampling period"):
        DeviceSampler(lambda row: None, period_s=0.0001)


def test_no_step_timer_on_the_cpu():
    assert make_step_timer("cpu") is None


@pytest.mark.gpu
def test_cuda_step_timer_measures_gpu_work():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    timer = make_step_timer("cuda")
    x = torch.randn(4096, 4096, device="cuda")
    timer.begin(0)
    for _ in range(20):
        x = x @ x
        x = x / x.norm()
    gpu_ns = timer.end()  # synchronises on the end event itself
    assert gpu_ns > 1_000_000  # twenty 4k matmuls take milliseconds of GPU time
