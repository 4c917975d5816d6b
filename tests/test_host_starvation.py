"""A wait for CPU the involuntary switches miss: a CPU engine's step whose threads wait at
a barrier for a worker queued behind other processes gets little CPU and is not
preempted. The step cost model's excess, matched by the CPU the step did not get, names
it as an inflation reason of its own ("CPU wait"), not as host contention: without the
sampler a wait for cores and a wait on the disk look alike."""

from __future__ import annotations

import numpy as np
import pytest

from perfdiag import load_run
from perfdiag.analyzers.serving import analyze_serving
from perfdiag.traces.schema import Step
from perfdiag.traces.writer import RunWriter

MS = 1_000_000


def _run(path, device: str, slow_cpu_ms: float, served: bool = False, replicas: int = 1):
    """300 decode steps of 2 ms at 1.1 CPU per second of step; every 5th step takes 6 ms
    of which it gets `slow_cpu_ms` of CPU, with no involuntary switch."""
    rng = np.random.default_rng(0)
    steps, t = [], 0
    for i in range(300):
        seqs = 1 + i % 4
        base = (1.6 + 0.2 * seqs) * MS * (1 + 0.01 * rng.standard_normal())
        slow = i % 5 == 4 and i > 20
        dur = base + 4 * MS if slow else base
        cpu = slow_cpu_ms * MS if slow else 1.1 * base
        steps.append(Step(i, t, t + int(dur), num_decode_seqs=seqs, num_context_tokens=64 * seqs,
                          cpu_time_ns=int(cpu), involuntary_switches=0))  # fmt: skip
        t += int(dur) + MS // 2
    config = {"run_options": {"engine": {"device": device}}}
    if served:  # perfdiag serve records the engine's own config
        config = {"engine_config": {"device": device}}
    if replicas > 1:
        config["data_parallel"] = {"size": replicas}
    with RunWriter(path, command=["test"], config=config, environment_info={"test": True}) as w:
        for s in steps:
            w.append("steps", s)
    return load_run(path)


def _waited(host) -> np.ndarray:
    return host.per_step["waited_for_cpu"].to_numpy(bool)


@pytest.mark.parametrize("served", [False, True])
def test_a_cpu_step_that_waited_for_cpu_is_named(tmp_path, served):
    analysis = analyze_serving(_run(tmp_path / "cpu", "cpu", slow_cpu_ms=2.0, served=served))
    host, inflation = analysis.host, analysis.inflation
    ids = host.per_step["step_id"].to_numpy()
    slow = (ids % 5 == 4) & (ids > 20)
    waited = _waited(host)
    assert waited[slow].mean() > 0.9 and waited[~slow].mean() < 0.05
    assert host.lost_s == 0  # not counted as other processes' doing
    # each slow step's 4 ms beyond the model is charged to the wait, not "unexplained"
    assert inflation.by_reason_s["CPU wait"] == pytest.approx(slow.sum() * 4e-3, rel=0.25)
    assert inflation.by_reason_s["unexplained"] < 0.1 * inflation.by_reason_s["CPU wait"]


def test_a_slow_step_that_got_its_cpu_did_not_wait(tmp_path):
    # The same excess with the CPU to match it (the work was larger, not starved).
    host = analyze_serving(_run(tmp_path / "busy", "cpu", slow_cpu_ms=6.5)).host
    assert not _waited(host).any()


def test_on_a_gpu_little_cpu_is_waiting_for_the_device(tmp_path):
    host = analyze_serving(_run(tmp_path / "gpu", "cuda", slow_cpu_ms=2.0)).host
    assert not _waited(host).any()


def test_replicas_sharing_the_cores_are_not_neighbours(tmp_path):
    # Without the sampler's view of other processes, a replica short of CPU may be short
    # of it because of the other replicas: the engine's own crowding.
    host = analyze_serving(_run(tmp_path / "dp", "cpu", slow_cpu_ms=2.0, replicas=2)).host
    assert not _waited(host).any()
