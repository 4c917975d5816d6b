"""A writer killed with SIGKILL leaves a readable run that says it crashed."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from perfdiag import load_run
from perfdiag.errors import RunFormatError

WRITER = textwrap.dedent(
    """
    import sys, time
    from perfdiag.traces.schema import Span, Step
    from perfdiag.traces.writer import RunWriter

    w = RunWriter(sys.argv[1], flush_interval_s=0.2)
    spans, steps, i = w.table("spans"), w.table("steps"), 0
    explicit = sys.argv[2] == "explicit"
    while True:
        for _ in range(500):
            spans.append(Span("k", "kernel", i, 1, step_id=i // 500))
            i += 1
        steps.append(Step(i // 500, i, i + 1))
        if explicit:
            w.flush()  # so the parent knows exactly what reached the file
            print(i, flush=True)
        elif i == 5000:
            print("appended", flush=True)  # then rely on the background flusher alone
            time.sleep(60)
        time.sleep(0.002)
    """
)


def _start_writer(path, mode):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), mode],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_sigkill_mid_run_keeps_every_flushed_batch(tmp_path, cli):
    path = tmp_path / "run"
    proc = _start_writer(path, "explicit")
    flushed = 0
    for _ in range(20):
        flushed = int(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    run = load_run(path)
    assert run.status == "crashed"
    starts = run.spans["start_ns"].to_numpy()
    assert len(starts) >= flushed
    assert (starts == range(len(starts))).all()  # no gaps, no reordering
    assert len(run.steps) >= flushed // 500

    result = cli("inspect", path)
    assert result.returncode == 0, result.stderr
    assert "crashed" in result.stdout


def test_background_flush_reaches_disk_within_a_second(tmp_path):
    path = tmp_path / "run"
    proc = _start_writer(path, "background")
    assert proc.stdout.readline().strip() == "appended"
    time.sleep(1.2)  # the writer now only sleeps; its flusher runs every 0.2 s
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    run = load_run(path)
    assert run.status == "crashed"
    assert len(run.spans) == 5000


def test_a_stream_cut_mid_batch_reads_up_to_the_cut(tmp_path):
    path = tmp_path / "run"
    proc = _start_writer(path, "explicit")
    for _ in range(5):
        proc.stdout.readline()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    stream = path / "tables" / "spans.arrows"
    whole = len(load_run(path).spans)
    with open(stream, "r+b") as f:  # cut the last message in half, as a kill mid-write would
        f.truncate(stream.stat().st_size - 1000)
    run = load_run(path)
    assert 0 < len(run.spans) < whole
    assert any("incomplete last batch" in w for w in run.warnings)


def test_a_corrupt_stream_in_a_finished_run_is_an_error(tmp_path, sample_run):
    path, _ = sample_run
    (path / "tables" / "spans.parquet").unlink()
    (path / "tables" / "spans.arrows").write_bytes(b"\xff\xff\xff\xff garbage" * 10)
    with pytest.raises(RunFormatError, match=r"spans\.arrows"):
        load_run(path)
