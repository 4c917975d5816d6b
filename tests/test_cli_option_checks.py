"""Options that used to be accepted or slow to refuse: capacity's levels out of order,
`timeline --top -1`, a --ceilings-dir that is not there, and `run` options checked only
after torch was loaded. Each is one line, exit code 1, before any work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fuzz_support import assert_clean, call_cli

from perfdiag.traces.importers.kineto import import_kineto

EXCERPT = Path(__file__).parent / "data" / "kineto_excerpt.json"


def _refused(outcome, *words: str) -> None:
    assert_clean(outcome, allowed=(1,))
    assert all(w in outcome.stderr for w in words), outcome.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--start", "1", "--floor", "10"], ["--floor", "below --start"]),
        (["--start", "5", "--floor", "5"], ["--floor", "below --start"]),
        (["--start", "0"], ["--start", "> 0"]),
        (["--start", "-3"], ["--start", "> 0"]),
        (["--start", "nan"], ["--start"]),
        (["--floor", "inf"], ["--floor"]),
        (["--floor", "0"], ["--floor", "> 0"]),
        (["--by", "concurrency", "--start", "0.5"], ["--start", "at least 1"]),
    ],
)
def test_capacity_refuses_levels_that_cannot_be_searched(tmp_path, args, words):
    outcome = call_cli("capacity", "--slo", "ttft=1", "-o", tmp_path / "cap", *args)
    _refused(outcome, *words)
    assert not (tmp_path / "cap").exists()  # refused before the first run


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    out = tmp_path_factory.mktemp("tl") / "run"
    import_kineto([EXCERPT], out, jobs=1)
    return out


@pytest.mark.parametrize("top", ["-1", "-100"])
def test_timeline_refuses_a_negative_top(imported, top):
    _refused(call_cli("timeline", imported, "--top", top), "--top", ">= 0")


def test_timeline_refuses_a_missing_ceilings_dir(imported, tmp_path):
    missing = tmp_path / "nowhere"
    _refused(call_cli("timeline", imported, "--ceilings-dir", missing), "--ceilings-dir",
             str(missing))  # fmt: skip
    a_file = tmp_path / "a-file"
    a_file.write_text("{}")
    _refused(call_cli("timeline", imported, "--ceilings-dir", a_file), "not a directory")


def test_timeline_accepts_an_empty_ceilings_dir_and_top_zero(imported, tmp_path):
    (tmp_path / "ceilings").mkdir()
    outcome = call_cli("timeline", imported, "--ceilings-dir", tmp_path / "ceilings",
                       "--top", "0", "--no-critical-path")  # fmt: skip
    assert_clean(outcome, allowed=(0,))


CHECK = """
import sys
from perfdiag.cli import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    code = e.code
print("torch" in sys.modules, code, file=sys.stderr)
"""


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["-n", "-1"], "requests"),
        (["--max-seqs", "0"], "max_num_seqs"),
        (["--block-size", "0"], "block_size"),
        (["--preset", "nope"], "unknown model preset"),
        (["--dtype", "fp7"], "dtype"),
        (["--tp", "0"], "tensor_parallel_size"),
    ],
)
def test_run_refuses_bad_options_before_loading_torch(tmp_path, args, words):
    done = subprocess.run([sys.executable, "-c", CHECK, "run", "-o", str(tmp_path / "r"), *args],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert lines[-1] == "False 1", done.stderr  # exit 1, and torch never imported
    assert len(lines) == 2 and lines[0].startswith("perfdiag: error: ") and words in lines[0]
    assert not (tmp_path / "r").exists()
