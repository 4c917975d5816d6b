"""Ctrl-C and SIGTERM at chosen moments of `perfdiag run`: inside and outside a profiler
window, and before the run exists. Each leaves a compacted run marked `interrupted` (or,
before the run, nothing and a message that says so), never a segfault or a traceback.

The signal is sent by the process to itself from the engine's stepping thread at a given
step, so the moment is exact whatever the machine's speed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    from perfdiag.probes import recorder, session

    sig, at = getattr(signal, sys.argv[1]), sys.argv[2]
    if at == "compaction":  # inside the second table's compaction, mid-table
        from perfdiag.traces import compaction
        stream, tables = compaction.iter_stream, []
        def _iter_stream(path, *args, **kwargs):
            tables.append(path)
            for i, batch in enumerate(stream(path, *args, **kwargs)):
                if len(tables) == 2 and i == 0:
                    os.kill(os.getpid(), sig)
                yield batch
        compaction.iter_stream = _iter_stream
    elif at == "manifest":  # just after the run's first manifest reaches the disk
        from perfdiag.traces import writer
        write, sent = writer.write_manifest, []
        def _write_manifest(*args):
            write(*args)
            if not sent:
                sent.append(1)
                os.kill(os.getpid(), sig)
        writer.write_manifest = _write_manifest
    elif at == "startup":
        build = session._build_engine
        def _build(options):
            os.kill(os.getpid(), sig)
            return build(options)
        session._build_engine = _build
    else:
        at, sent = int(at), []
        on_step = recorder.RunRecorder.on_step
        def _on_step(self, e):
            on_step(self, e)
            if e.step_id >= at and not sent:
                sent.append(1)
                os.kill(os.getpid(), sig)
        recorder.RunRecorder.on_step = _on_step
    from perfdiag.cli import main
    main(sys.argv[3:])
    """
)


def _run(tmp_path, sig: str, at: str, *options: str) -> tuple[subprocess.CompletedProcess, str]:
    out = tmp_path / "run"
    args = ["run", "--preset", "tiny", "-n", "400", "--warmup", "0", "--output-len", "32",
            "--prompt-len", "16", "-c", "2", "--closed", "--no-device-sampling", "-q",
            "--out", str(out), *options]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, sig, at, *args],
        capture_output=True,
        text=True,
        timeout=300,
        # SIGINT is not ignored (a shell's background job would ignore it)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    return proc, str(out)


def _assert_interrupted(proc, out: str, code: int) -> dict:
    assert proc.returncode == code, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert f"everything recorded is kept in {out}" in proc.stdout.replace("\n", "")
    with open(os.path.join(out, "manifest.json")) as f:
        manifest = json.load(f)
    assert manifest["status"] == "interrupted"
    tables = os.listdir(os.path.join(out, "tables"))
    assert "steps.parquet" in tables and not any(t.endswith(".arrows") for t in tables)
    return manifest


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_inside_a_profiler_window_closes_it_cleanly(tmp_path, sig, code):
    proc, out = _run(tmp_path, sig, "6", "--profile-steps", "3:100000")
    manifest = _assert_interrupted(proc, out, code)
    window = manifest["profiler_window"]
    assert window["note"] == "the run ended inside the window"
    assert window["captured_steps"][0] == 3 and window["captured_steps"][1] >= 6
    assert window["spans"] > 0
    assert os.path.exists(os.path.join(out, window["raw_trace"]))


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_outside_any_window(tmp_path, sig):
    proc, out = _run(tmp_path, sig, "4")
    _assert_interrupted(proc, out, 130 if sig == "SIGINT" else 143)


def test_a_window_still_open_when_the_run_ends(tmp_path, cli):
    out = tmp_path / "run"
    result = cli("run", "--preset", "tiny", "-n", "4", "--warmup", "0", "--output-len", "4",
                 "--no-device-sampling", "-q", "--profile-steps", "2:40",
                 "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    window = manifest["profiler_window"]
    assert window["note"] == "the run ended inside the window" and window["spans"] > 0


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_before_the_run_exists_says_nothing_was_kept(tmp_path, sig):
    proc, out = _run(tmp_path, sig, "startup")
    assert proc.returncode == (130 if sig == "SIGINT" else 143), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "before the run started: nothing was recorded" in proc.stdout
    assert not os.path.exists(out)


def _assert_closed_cleanly(proc, out: str, code: int, statuses: tuple[str, ...]) -> None:
    """Whatever the moment: the message, the exit code, a closed run (never `running`),
    no lock, no temporary file, and every table readable."""
    from perfdiag import load_run

    assert proc.returncode == code, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert f"everything recorded is kept in {out}" in proc.stdout.replace("\n", "")
    with open(os.path.join(out, "manifest.json")) as f:
        assert json.load(f)["status"] in statuses
    left = [n for _, _, files in os.walk(out) for n in files]
    assert ".writer.lock" not in left and not any(n.endswith(".tmp") for n in left), left
    run = load_run(out)
    assert run.status in statuses
    for name in run.sources:
        run.table(name)


@pytest.mark.parametrize(("sig", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_during_compaction_leaves_a_finished_run(tmp_path, sig, code):
    proc, out = _run(tmp_path, sig, "compaction", "-n", "6")
    _assert_closed_cleanly(proc, out, code, ("complete",))
    from perfdiag import load_run

    run = load_run(out)
    assert len(run.requests) == 6  # the recording had finished: nothing is missing
    assert "compaction" in " ".join(run.warnings)  # the streams left are said to be


@pytest.mark.parametrize(("sig", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_just_after_the_manifest_is_written(tmp_path, sig, code):
    proc, out = _run(tmp_path, sig, "manifest")
    _assert_closed_cleanly(proc, out, code, ("interrupted",))


EARLY = textwrap.dedent(
    """
    import os, signal, sys
    import perfdiag

    sig = getattr(signal, sys.argv[1])

    class SignalMidImport:  # the signal arrives while the CLI's modules are imported
        def find_spec(self, name, path=None, target=None):
            if name == "perfdiag.cli.run":
                sys.meta_path.remove(self)
                os.kill(os.getpid(), sig)
            return None

    sys.meta_path.insert(0, SignalMidImport())
    from perfdiag.cli import main
    main(sys.argv[2:])
    """
)


@pytest.mark.parametrize(
    ("sig", "code", "word"), [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated")]
)
def test_a_signal_in_the_first_second_says_so(tmp_path, sig, code, word):
    proc = subprocess.run(
        [sys.executable, "-c", EARLY, sig, "run", "--preset", "tiny", "--out", str(tmp_path / "r")],
        capture_output=True, text=True, timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert proc.returncode == code, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert f"perfdiag: {word}" in proc.stderr
    assert not (tmp_path / "r").exists()
