"""Every writing command on a full (or read-only) disk: one line that names the path and
says "disk full", exit code 1, no partial file left (`.tmp`, `.importing-<pid>/`, a
`tables/` without a manifest, a 0-byte result), and the user's recorded run untouched.

A full disk is simulated in-process (`os.write`, the manifest's write) everywhere, and
made for real with a small tmpfs when the tests run as root."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from fuzz_support import assert_clean, call_cli

from perfdiag.traces import writer as writer_module

KINETO = Path(__file__).resolve().parent / "data" / "kineto_excerpt.json"
RUN_ARGS = ("run", "--preset", "tiny", "-n", "4", "--warmup", "0", "--output-len", "4",
            "--prompt-len", "16", "--no-device-sampling", "-q")  # fmt: skip


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    from perfdiag.probes.run_options import EngineOptions, ProbeOptions, RunOptions
    from perfdiag.probes.session import record_run
    from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec

    workload = WorkloadSpec(requests=6, warmup=0, arrival=ArrivalSpec(mode="open", rate=40.0),
                            prompt_len=LengthSpec(value=16),
                            output_len=LengthSpec(value=4))  # fmt: skip
    options = RunOptions(EngineOptions(preset="tiny", kv_cache_mb=4), workload,
                         ProbeOptions(device_sampling=False))  # fmt: skip
    path = tmp_path_factory.mktemp("full") / "run"
    record_run(options, path, command=["pytest"])
    return path


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _no_partial_files(root: Path) -> None:
    for p in root.rglob("*"):
        assert not p.name.endswith(".tmp") and ".importing-" not in p.name, p
        if p.is_file() and p.suffix in (".json", ".html", ".md", ".png"):
            assert p.stat().st_size > 0, f"{p} is empty"
        if p.is_dir() and p.name == "tables":
            assert (p.parent / "manifest.json").exists(), f"{p} without a manifest"


def _one_disk_full_line(outcome, path) -> None:
    assert_clean(outcome, allowed=(1,))
    lines = [line for line in outcome.stderr.splitlines() if line.startswith("perfdiag:")]
    assert len(lines) == 1, outcome.stderr
    assert "disk full" in lines[0] and str(path) in lines[0], lines[0]


def _enospc(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize(
    ("command", "result"),
    [
        (("timeline",), "roofline.json"),
        (("analyze",), "metrics.json"),
        (("report",), "report.html"),
    ],
)
def test_a_results_write_on_a_full_disk(recorded, tmp_path, monkeypatch, command, result):
    run = tmp_path / "run"
    shutil.copytree(recorded, run)
    before = _files(run)
    monkeypatch.setattr(os, "write", _enospc)
    outcome = call_cli(*command, run)
    monkeypatch.undo()
    _one_disk_full_line(outcome, run / "results" / result)
    _no_partial_files(run)
    after = _files(run)
    assert {k: v for k, v in after.items() if not k.startswith("results")} == before


def test_run_onto_a_full_disk_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(writer_module, "write_manifest", _enospc)
    out = tmp_path / "run"
    outcome = call_cli(*RUN_ARGS, "--out", out)
    _one_disk_full_line(outcome, out)
    assert not out.exists()


def test_import_onto_a_full_disk_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(writer_module, "write_manifest", _enospc)
    outcome = call_cli("import", KINETO, "--out", tmp_path / "imp")
    assert_clean(outcome, allowed=(1,))
    assert "disk full" in outcome.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_import_that_fills_the_disk_midway_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(writer_module.TableAppender, "_write", _enospc)
    outcome = call_cli("import", KINETO, "--out", tmp_path / "imp")
    assert_clean(outcome, allowed=(1,))
    assert "disk full" in outcome.stderr
    assert list(tmp_path.iterdir()) == []


# -- a real full filesystem (root only) ----------------------------------------------------


@pytest.fixture
def full_disk(tmp_path, recorded):
    """A 32 MiB tmpfs holding a copy of the run, then filled to the last byte."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs (the in-process tests cover it)")
    mount = tmp_path / f"small-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount)],
                          capture_output=True)  # fmt: skip
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        shutil.copytree(recorded, mount / "run")
        with open(mount / "filler", "wb", buffering=0) as f:
            for chunk in (1 << 16, 1):  # big writes, then the last bytes one at a time
                try:
                    while f.write(b"\0" * chunk):
                        pass
                except OSError:
                    pass
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_every_writing_command_on_a_real_full_disk(full_disk, cli):
    run = full_disk / "run"
    before = {k: v for k, v in _files(run).items() if not k.startswith("results")}
    commands = [
        ("timeline", run),
        ("analyze", run),
        ("report", run),
        ("export", run, "-f", "chrome"),
        ("import", KINETO, "--out", full_disk / "imp"),
        (*RUN_ARGS, "--out", full_disk / "new"),
    ]
    for args in commands:
        result = cli(*args, timeout=300)
        assert result.returncode == 1, (args, result.stderr[-1500:])
        assert "Traceback" not in result.stderr + result.stdout
        lines = [line for line in result.stderr.splitlines() if line.startswith("perfdiag:")]
        assert len(lines) == 1 and "disk full" in lines[0], (args, result.stderr)
        _no_partial_files(full_disk)
    assert not (full_disk / "imp").exists() and not (full_disk / "new").exists()
    assert {k: v for k, v in _files(run).items() if not k.startswith("results")} == before
