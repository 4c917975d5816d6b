"""The slow-rank fault (probes/faults.py): a real neighbour on the rank's core, or real
SIGSTOP pauses of its process, only while the run records; options are validated."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from perfdiag.errors import ConfigError
from perfdiag.probes.faults import FaultOptions, rank_fault


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def worker():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    yield p
    p.kill()
    p.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and affinity: Linux")
def test_stalls_stop_the_rank_and_always_let_it_go(worker):
    faults = FaultOptions(slow_rank=1, slow_rank_stall_ms=40.0, slow_rank_period_ms=50.0)
    seen = set()
    with rank_fault(faults, [os.getpid(), worker.pid]):
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            seen.add(_state(worker.pid))
            time.sleep(0.005)
    assert "T" in seen  # stopped, for real
    time.sleep(0.05)
    assert _state(worker.pid) != "T"  # and running again once the block ends


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs CPU affinity")
def test_a_neighbour_shares_the_rank_core_while_the_block_runs(worker):
    cores = sorted(os.sched_getaffinity(0))
    faults = FaultOptions(slow_rank=1, slow_rank_neighbours=1)
    before = {p for p in os.listdir("/proc") if p.isdigit()}
    with rank_fault(faults, [os.getpid(), worker.pid]):
        assert os.sched_getaffinity(worker.pid) == {cores[1 % len(cores)]}
        burners = [int(p) for p in os.listdir("/proc") if p.isdigit() and p not in before]
        pinned = [p for p in burners if _affinity(p) == {cores[1 % len(cores)]}]
        assert pinned, "no neighbour pinned to the rank's core"
    assert all(not os.path.exists(f"/proc/{p}") or _state(p) == "Z" for p in pinned)


def _affinity(pid: int):
    try:
        return os.sched_getaffinity(pid)
    except OSError:
        return None


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(slow_rank=1), "needs slow_rank_neighbours or slow_rank_stall_ms"),
        (dict(slow_rank=0, slow_rank_stall_ms=5.0), "slow_rank must be >= 1"),
        (dict(slow_rank=1, slow_rank_stall_ms=30.0), "must be < slow_rank_period_ms"),
        (dict(slow_rank=-1, slow_rank_neighbours=1), "slow_rank must be >= 0"),
    ],
)
def test_bad_rank_faults_are_refused_in_one_line(kw, message):
    with pytest.raises(ConfigError, match=message):
        FaultOptions(**kw)


def test_a_rank_the_run_does_not_have_is_refused():
    faults = FaultOptions(slow_rank=1, slow_rank_neighbours=1)
    with pytest.raises(ConfigError, match="the run has 1 rank"), rank_fault(faults, [os.getpid()]):
        pass
