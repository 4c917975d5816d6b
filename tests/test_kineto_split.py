"""A large trace read by two processes (kineto_split.py) gives the one-process read's rows,
in the same order, with the same counts, wherever the cut falls; and when the split cannot
be trusted (a span waits for a flow, a cut inside a string, a helper that fails) the
import still ends with the one-process read's run."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from unittest import mock

import pytest

import perfdiag
from perfdiag.traces.importers import kineto_split
from perfdiag.traces.importers.kineto import import_kineto
from perfdiag.traces.importers.kineto_events import KinetoFileReader
from perfdiag.traces.importers.kineto_split import Helper, SplitRead, SplitReadFailed

KINETO = Path(__file__).resolve().parent / "data" / "kineto"  # real traces, as in conftest.py
V100 = KINETO / "v100_train_ns_resolution.json.gz"
NCCL = KINETO / "a100_nccl_comm.json.gz"
COLUMNS = ("name", "category", "start_ns", "dur_ns", "pid", "tid", "device", "stream", "rank",
           "step_id", "correlation", "flops", "bytes", "args")  # fmt: skip


def _at(cut):
    """cut_after's stand-in: the cut at a fraction of the text, or at a character."""
    return lambda pos, total: int(total * cut) if isinstance(cut, float) else cut


def _read(path: Path, tmp: Path, cut: float | int | None):
    """Everything a reader hands on, in order, and its counts; `cut`: a helper reads the
    tail from this fraction of the text, or this character (None: one process)."""
    spans, counters = [], []

    def span_batch(b):
        spans.extend(tuple(row[c] for c in COLUMNS) for row in b.to_pylist())

    def counter_batch(b):
        counters.extend(tuple(row.values()) for row in b.to_pylist())

    reader = KinetoFileReader(path, spans.append, lambda row: counters.append(tuple(row)),
                              rank_of=lambda h: 3, time_offset_ns=7,
                              add_spans=span_batch)  # fmt: skip
    split = helper = None
    if cut is not None:
        helper = Helper()
        split = SplitRead(helper, path, rank=3, offset=7, flags={}, scratch=tmp / "split",
                          add_spans=span_batch, add_counters=counter_batch)  # fmt: skip
    try:
        with (
            mock.patch.object(kineto_split, "READY_WAIT_S", 60.0),  # the cut is placed
            mock.patch.object(kineto_split, "MIN_TAIL_CHARS", 0),
            mock.patch.object(kineto_split, "cut_after", _at(cut)),
        ):
            reader.read(fast=True, split=split)
    finally:
        if split is not None:
            split.close()
            helper.close()
    s = reader.stream
    counts = (reader.spans_by_category, reader.skipped, reader.processes, reader.threads,
              reader.profiler_windows, reader.flows_linked, reader.unresolved, s.header,
              s.events_seen)  # fmt: skip
    return spans, counters, counts, split


@pytest.mark.parametrize(("path", "cut", "fork"),
                         [(V100, 0.3, True), (V100, 0.77, True), (NCCL, 0.5, True),
                          (V100, 0.5, False)],
                         ids=["v100-0.3", "v100-0.77", "nccl-0.5", "v100-0.5-fresh"])  # fmt: skip
def test_split_read_gives_the_one_process_rows(tmp_path, path, cut, fork):
    with (
        mock.patch.object(kineto_split, "FORK", fork),  # False: a fresh interpreter
        # An earlier test's library thread (tqdm's monitor) would rule the fork out.
        mock.patch.object(kineto_split, "_single_threaded", lambda: True),
    ):
        spans, counters, counts, split = _read(path, tmp_path, cut)
    assert split.helper.forked == fork
    assert split.state == "reading" and split.helper_events > 0  # the helper read the tail
    one = _read(path, tmp_path, None)
    assert len(spans) == len(one[0])
    for i, (a, b) in enumerate(zip(spans, one[0], strict=True)):
        assert a == b, f"row {i}"
    assert counters == one[1]
    assert counts == one[2]
    assert not (tmp_path / "split").exists()  # the scratch directory is gone


def _trace(path: Path, events: int, waiting_from: int | None = None, name: str = "op"):
    """`events` kernels, launches and launch flows; from `waiting_from` on, kernels
    carry no correlation and are named by launch flow events (older Kineto)."""
    out = []
    for i in range(events // 4):
        ts = 1000 + 10 * i
        corr = {} if waiting_from is not None and 4 * i >= waiting_from else {"correlation": i}
        out.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 1,
                "tid": 1,
                "ts": ts,
                "dur": 2,
                "args": {"correlation": i},
            }
        )
        out.append(
            {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": i, "pid": 1, "tid": 1, "ts": ts}
        )
        out.append(
            {
                "ph": "f",
                "cat": "ac2g",
                "name": "ac2g",
                "id": i,
                "pid": 0,
                "tid": 7,
                "ts": ts + 3,
                "bp": "e",
            }
        )
        out.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": f"{name}{i}",
                "pid": 0,
                "tid": 7,
                "ts": ts + 3,
                "dur": 5,
                "args": {"device": 0, "stream": 7, **corr},
            }
        )
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": out, "tail": {"k": 1}}))
    return path


def test_a_span_waiting_for_a_flow_before_the_cut_is_read_alone(tmp_path):
    path = _trace(tmp_path / "t.json", 60_000, waiting_from=0)
    spans, counters, counts, split = _read(path, tmp_path, 0.5)
    assert split.state == "alone"  # seen in the first batch: this process read it all
    assert (spans, counters, counts) == _read(path, tmp_path, None)[:3]
    assert counts[5] == 15_000  # flows_linked: every kernel named by its flow


def test_a_span_waiting_after_the_cut_ends_the_split(tmp_path):
    path = _trace(tmp_path / "t.json", 60_000, waiting_from=50_000)
    with pytest.raises(SplitReadFailed):
        _read(path, tmp_path, 0.5)


def _same_run(tmp_path, path: Path, cut=0.5) -> dict:
    """Import `path` split (forced; `cut` as in `_read`) and in one process: the same
    run. The split one's file meta."""
    with (
        mock.patch.object(kineto_split, "READY_WAIT_S", 60.0),
        mock.patch.object(kineto_split, "SPLIT_MIN_CHARS", 0),
        mock.patch.object(kineto_split, "MIN_TAIL_CHARS", 0),
        mock.patch.object(kineto_split, "cut_after", _at(cut)),
    ):
        import_kineto([path], tmp_path / "split")
    import_kineto([path], tmp_path / "one", jobs=1)
    a, b = perfdiag.load_run(tmp_path / "split"), perfdiag.load_run(tmp_path / "one")
    assert a.spans.equals(b.spans)
    assert a.counters.equals(b.counters)
    meta_a, meta_b = (r.manifest.extra["kineto"]["files"][0] for r in (a, b))
    assert meta_b["workers"] == 1
    for key in ("events", "spans", "skipped", "flows_linked", "header", "profiler_windows"):
        assert meta_a[key] == meta_b[key], key
    assert not list((tmp_path / "split").glob(".split*"))
    return meta_a


def test_a_split_import_is_the_one_process_import(tmp_path):
    meta = _same_run(tmp_path, V100)
    assert meta["workers"] == 2 and meta["front_end"] == "fast"


def _fooled(tmp: Path) -> tuple[Path, int]:
    """A trace whose kernel names hold the cut pattern, and a cut just before one."""
    path = _trace(tmp / "fooled.json", 60_000, name='k}, {"ph": "X"} ,{')
    text = path.read_text()
    return path, text.index("k}, {", len(text) // 2) - 1


def test_fallbacks_end_with_the_one_process_run(tmp_path):
    # A flow needed after the cut: the split fails and one process reads the file again.
    path = _trace(tmp_path / "late.json", 60_000, waiting_from=50_000)
    assert _same_run(tmp_path / "late", path)["workers"] == 1
    # The cut falls just before a kernel name that holds the cut pattern: it cannot decode.
    path, cut = _fooled(tmp_path)
    with pytest.raises(SplitReadFailed):
        _read(path, tmp_path, cut)
    meta = _same_run(tmp_path / "fooled", path, cut)
    assert meta["front_end"] == "fast" and meta["workers"] == 1
    # A helper that cannot start (a fresh interpreter that exits): this process reads alone.
    path = _trace(tmp_path / "plain.json", 60_000)
    with (
        mock.patch.object(kineto_split, "FORK", False),
        mock.patch.object(kineto_split, "_BOOT", "raise SystemExit(3)"),
    ):
        assert _same_run(tmp_path / "dead", path)["workers"] == 1


def test_one_helper_reads_the_tail_of_every_large_file(tmp_path):
    paths = []
    for rank in (0, 1):
        path = _trace(tmp_path / f"rank{rank}.json", 40_000 + 8_000 * rank)
        doc = json.loads(path.read_text())
        doc["distributedInfo"] = {"rank": rank, "world_size": 2}
        path.write_text(json.dumps(doc))
        paths.append(path)
    with (
        mock.patch.object(kineto_split, "READY_WAIT_S", 60.0),
        mock.patch.object(kineto_split, "SPLIT_MIN_CHARS", 0),
        mock.patch.object(kineto_split, "MIN_TAIL_CHARS", 0),
        mock.patch.object(kineto_split, "cut_after", _at(0.4)),
    ):
        import_kineto(paths, tmp_path / "split")
    import_kineto(paths, tmp_path / "one", jobs=1)
    a, b = perfdiag.load_run(tmp_path / "split"), perfdiag.load_run(tmp_path / "one")
    assert a.spans.equals(b.spans) and sorted(a.spans["rank"].unique()) == [0, 1]
    files = a.manifest.extra["kineto"]["files"]
    assert [f["workers"] for f in files] == [2, 2]


def test_the_cut_balances_the_helpers_skipping():
    # The further this process has read, the larger its share of what is left, since the
    # helper must first skip (decompress) everything before the cut; both then finish
    # together (this process also writes its rows as it goes: MAIN_COST).
    shares = []
    for pos in (0, 400, 800):
        cut = kineto_split.cut_after(pos, 1000)
        mine, helper = cut - pos, 1000 - cut
        shares.append(mine / (1000 - pos))
        cost = kineto_split.MAIN_COST * mine
        assert abs(cost - (kineto_split.SKIP_COST * cut + helper)) <= 2
    assert shares == sorted(shares) and shares[-1] > 0.5
    assert kineto_split.cut_after(900, 1000) is None  # the helper would read next to nothing


def test_a_process_with_other_threads_starts_a_fresh_helper():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        helper = Helper()
        try:
            assert not helper.forked
            assert helper.receive(wait=60.0) == {"ready": True}
        finally:
            helper.close()
    finally:
        stop.set()
        thread.join()


def test_small_traces_and_one_job_are_not_split(tmp_path):
    path = _trace(tmp_path / "t.json", 3_000)
    assert not kineto_split.plan_split(path, None)  # below the size worth a helper
    with mock.patch.object(kineto_split, "SPLIT_MIN_CHARS", 0):
        assert kineto_split.plan_split(path, None) == (kineto_split.machine_cores() >= 2)
        assert not kineto_split.plan_split(path, 1)


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "fresh"])
def test_an_error_mid_split_leaves_no_helper_behind(tmp_path, fork):
    path = _trace(tmp_path / "t.json", 60_000)
    seen = []

    def failing_sink(batch):
        seen.append(batch)
        if len(seen) == 3:
            raise RuntimeError("disk full")

    with (
        mock.patch.object(kineto_split, "FORK", fork),
        mock.patch.object(kineto_split, "_single_threaded", lambda: True),
    ):
        helper = Helper()
    assert helper.forked == fork
    split = SplitRead(helper, path, rank=0, offset=0, flags={}, scratch=tmp_path / "split",
                      add_spans=failing_sink, add_counters=failing_sink)  # fmt: skip
    reader = KinetoFileReader(path, seen.append, seen.append, rank_of=lambda h: 0,
                              add_spans=failing_sink)  # fmt: skip
    with (
        mock.patch.object(kineto_split, "READY_WAIT_S", 60.0),
        mock.patch.object(kineto_split, "MIN_TAIL_CHARS", 0),
        mock.patch.object(kineto_split, "cut_after", _at(0.9)),
        mock.patch("perfdiag.traces.importers.chrome_stream.BATCH_CHARS", 1 << 16),
    ):
        try:
            with pytest.raises(RuntimeError, match="disk full"):
                reader.read(fast=True, split=split)
            assert split.state == "reading"  # the helper was given the tail
        finally:
            split.close()
            helper.close()
            helper.close()  # closing twice is harmless
    with pytest.raises(ProcessLookupError):
        os.kill(helper.pid, 0)  # stopped and reaped
    assert not (tmp_path / "split").exists()
