"""A write that fails (disk full, I/O error) stops the run at once with one line, and
everything written before it stays readable. On a real full filesystem (a small tmpfs,
when the tests run as root) and through a shim that fails the Nth batch (everywhere)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from perfdiag import load_run
from perfdiag.probes.run_options import EngineOptions, ProbeOptions, RunOptions
from perfdiag.probes.session import record_run
from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec
from perfdiag.traces import writer as writer_module
from perfdiag.traces.schema import Step
from perfdiag.traces.writer import WriteFailedError

REQUESTS = 3000  # far more than are served before the failure stops the run


def _options() -> RunOptions:
    workload = WorkloadSpec(
        requests=REQUESTS,
        warmup=0,
        arrival=ArrivalSpec(mode="closed", concurrency=8),
        prompt_len=LengthSpec(value=16),
        output_len=LengthSpec(value=32),
    )
    return RunOptions(
        EngineOptions(preset="tiny", kv_cache_mb=4), workload, ProbeOptions(device_sampling=False)
    )


@pytest.mark.parametrize(
    ("code", "words"), [(errno.ENOSPC, "No space left"), (errno.EIO, "Input/output error")]
)
def test_a_failed_write_stops_the_run_and_keeps_what_was_written(tmp_path, monkeypatch, code,
                                                                 words):  # fmt: skip
    real_write, batches = writer_module.TableAppender._write, []

    def failing_write(self, batch):
        if len(batches) >= 12:
            raise OSError(code, os.strerror(code))
        batches.append(batch.num_rows)
        real_write(self, batch)

    monkeypatch.setattr(writer_module.TableAppender, "_write", failing_write)
    with pytest.raises(WriteFailedError) as info:
        record_run(_options(), tmp_path / "run", command=["pytest"])
    message = str(info.value)
    assert "\n" not in message and words in message and str(tmp_path / "run") in message
    run = load_run(tmp_path / "run")
    assert run.status == "crashed"
    assert run.manifest.extra["write_error"] == f"writing the run failed ({os.strerror(code)})"
    written = len(run.steps) + len(run.request_events) + len(run.spans) + len(run.requests)
    written += len(run.counters)
    assert written == sum(batches)  # every batch that reached the file, no more, no less
    # stopped at once, not at the end (12 batches held 360-368 requests on a loaded CI host)
    assert len(run.requests) < REQUESTS // 4


def _can_mount_tmpfs(path) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(path)],
                          capture_output=True)  # fmt: skip
    return done.returncode == 0


def test_a_full_filesystem(tmp_path, cli):
    mount = tmp_path / f"small-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    if not _can_mount_tmpfs(mount):
        pytest.skip("needs root and tmpfs to make a small filesystem (the shim test covers it)")
    try:
        out = mount / "run"
        result = cli("run", "--preset", "tiny", "-n", str(REQUESTS), "--warmup", "0",
                     "--output-len", "32", "--prompt-len", "16", "-c", "8", "--closed", "-q",
                     "--no-device-sampling", "--out", str(out), timeout=300)  # fmt: skip
        assert result.returncode == 1
        assert "Traceback" not in result.stderr + result.stdout
        errors = [line for line in result.stderr.splitlines() if line.startswith("perfdiag:")]
        assert len(errors) == 1 and "No space left on device" in errors[0]
        run = load_run(out)  # the streams stay: no room to compact them
        assert run.status == "crashed"
        assert len(run.requests) < REQUESTS // 10  # stopped at once, not at the end
        # Which tables got rows in before the disk filled depends on flush timing (a busy
        # table is written when its batch fills, a quiet one every flush interval), so the
        # test asks only that what did reach the disk is read back.
        assert len(run.requests) + len(run.request_events) + len(run.steps) > 0
        inspected = cli("inspect", str(out))
        assert inspected.returncode == 0 and "crashed" in inspected.stdout
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)  # -l: mapped files


def test_the_flusher_stops_holding_rows_after_a_failure(tmp_path, monkeypatch):
    def failing_write(self, batch):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(writer_module.TableAppender, "_write", failing_write)
    w = writer_module.RunWriter(tmp_path / "w", flush_interval_s=0.1)
    stopped = []
    w.on_failure(lambda: stopped.append(True))
    steps = w.table("steps")
    steps.append(Step(0, 0, 1))
    deadline = time.monotonic() + 5
    while not stopped and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stopped
    for i in range(1000):  # a recorder that has not stopped yet
        steps.append(Step(i, 0, 1))
    time.sleep(0.3)
    assert steps.pending() == 0  # dropped and counted, not piling up in memory
    w.close()
    assert w.rows_lost >= 1000
    assert load_run(tmp_path / "w").status == "crashed"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
