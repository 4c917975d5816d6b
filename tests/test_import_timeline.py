"""`perfdiag import TRACE -o RUN --timeline` (issue 36): the timeline in the import's own
process (one interpreter start-up instead of two) prints what `perfdiag import` then
`perfdiag timeline` print, and its `--json` is one document holding both."""

import json
from pathlib import Path

import pytest

KINETO = Path(__file__).resolve().parent / "data" / "kineto"
# GPU work, launches and a blocking sync: the critical path and its what-if replays run.
TRACE = KINETO / "a100_alexnet_cuda_sync.json.gz"
WIDE = {"COLUMNS": "160"}


def _cli(*args, env=None):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "perfdiag", *map(str, args)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})  # fmt: skip


def _without_seconds(summary: dict) -> dict:
    """The import's summary less what differs between two imports (its time, its run)."""
    return {k: v for k, v in summary.items() if k not in ("seconds", "events_per_s", "run")}


def test_json_holds_the_import_summary_and_the_timeline_of_two_commands(tmp_path):
    one = _cli("import", TRACE, "-o", tmp_path / "one", "--timeline", "--json")
    assert one.returncode == 0, one.stderr[-2000:]
    both = json.loads(one.stdout)  # one JSON document, not two
    alone = _cli("import", TRACE, "-o", tmp_path / "two", "--json")
    assert alone.returncode == 0, alone.stderr[-2000:]
    timeline = _cli("timeline", tmp_path / "two", "--json")
    assert timeline.returncode == 0, timeline.stderr[-2000:]
    expected = json.loads(timeline.stdout)
    assert both["timeline"] == expected
    assert both["timeline"]["critical_path"]["items"]  # the critical path ran, as timeline's
    summary = {k: v for k, v in both.items() if k != "timeline"}
    assert _without_seconds(summary) == _without_seconds(json.loads(alone.stdout))
    assert summary["run"] == str(tmp_path / "one")
    # the run is written as `perfdiag import` writes it, roofline result and all
    assert (tmp_path / "one/results/roofline.json").read_text() == (
        tmp_path / "two/results/roofline.json"
    ).read_text()


def test_text_is_the_import_then_the_timeline(tmp_path):
    one = _cli("import", TRACE, "-o", tmp_path / "one", "--timeline", env=WIDE)
    assert one.returncode == 0, one.stderr[-2000:]
    imported = _cli("import", TRACE, "-o", tmp_path / "two", env=WIDE).stdout
    timeline = _cli("timeline", tmp_path / "two", env=WIDE).stdout
    head, tail = imported.splitlines(), timeline.splitlines()
    got = one.stdout.splitlines()
    assert len(got) == len(head) + len(tail)
    # the import's lines name the run and its speed; the rest is the timeline's, as is
    assert got[len(head) :] == tail
    assert got[0].startswith("imported ") and str(tmp_path / "one") in one.stdout
    assert got[1 : len(head)] == [x.replace("two", "one") for x in head[1:]]
    assert "critical path (" in one.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ray"], "--timeline"),
        (["--ray-address", "auto"], "--timeline"),
    ],
)
def test_timeline_with_ray_is_refused_in_one_line(tmp_path, args, message):
    r = _cli("import", TRACE, "-o", tmp_path / "run", "--timeline", *args)
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and message in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()  # refused before any work


def test_a_bad_trace_is_one_line_and_no_run(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": ')
    r = _cli("import", bad, "-o", tmp_path / "run", "--timeline")
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()


def test_help_names_the_option():
    r = _cli("import", "--help", env=WIDE)
    assert r.returncode == 0 and "--timeline" in r.stdout
