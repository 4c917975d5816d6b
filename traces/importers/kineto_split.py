"""One large trace read by two processes with the fast front end: the importing process
reads from the start, a helper process reads the tail, and they meet where they agree.

Decoding is the import's cost and holds the GIL, so a second core can only help from
another process. The helper is a fresh interpreter (never a fork of a process whose
threads may hold locks, and not multiprocessing's spawn, which would import the caller's
main module again). It says when its imports are done (~0.25 s); the importing process,
which has been reading all the while, then places the cut so that both finish together:
half of what is left, moved for the helper's cost of skipping the text before its range.

The helper writes its rows to Arrow IPC files in a scratch directory (a pipe would stall
it whenever this process is busy decoding), and this process appends them after its own:
the run's rows, their order and its counts are those of a one-process read
(tests/test_kineto_split.py).

It gives up (SplitReadFailed: the caller reads the file in one process) when the helper
fails, when the two disagree on the cut (a `},{` inside a string fooled the search), or
when a span waits for a flow event (its flow may sit in the other range; if that is seen
before the cut is placed, this process simply reads on alone). A helper that is not
ready before this process is nearly done is sent away unused.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
from pathlib import Path

from .kineto_events import FastReadFailed
from .kineto_parallel import text_size_estimate

SPLIT_MIN_CHARS = 32 << 20  # below ~150k events the helper's start-up eats the gain
MIN_TAIL_CHARS = 8 << 20  # the least left to hand over when the helper is ready
# The helper's cost of a character it skips (decompressed and dropped) against one it
# decodes into rows: measured ~0.1 on the shared V100 trace's text.
SKIP_COST = 0.1
READY_WAIT_S = 0.0  # how long to wait for the helper between batches (tests: long)
_BOOT = (
    "import json, sys; job = json.loads(sys.stdin.readline()); sys.path[:0] = job['sys_path']; "
    f"from {__name__} import helper_main; helper_main(job)"
)
_TABLES = ("spans", "counters")


class SplitReadFailed(Exception):
    """The split read cannot be trusted: read the file in one process instead."""


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def plan_split(path: Path, jobs: int | None) -> bool:
    """Whether a helper process should read `path`'s tail (`jobs`: 1 forbids it)."""
    if jobs is not None and jobs <= 1:
        return False
    return usable_cpus() >= 2 and text_size_estimate(path) >= SPLIT_MIN_CHARS


def cut_after(pos: int, total: int) -> int | None:
    """Where to cut when the helper is ready and this process is at character `pos` of
    `total`: this process decodes a share a of what is left (R), the helper skips up to
    the cut and decodes the rest; a·R = SKIP_COST·(pos + a·R) + (1 − a)·R. None when
    the helper would read less than a tenth of the rest: not worth its rows' hand-over."""
    left = total - pos
    if left <= 0:
        return None
    share = (left + SKIP_COST * pos) / ((2 - SKIP_COST) * left)
    return pos + int(share * left) if share <= 0.9 else None


class SplitRead:
    """The importing process's side: starts the helper, places the cut between two of
    its own batches (`between_batches`), then checks and appends the helper's rows
    (`join`). `close()` always: it stops the helper and removes the scratch directory."""

    def __init__(self, path: Path, *, rank, offset: int, flags: dict, scratch: Path,
                 add_spans, add_counters):  # fmt: skip
        self.scratch = scratch
        self.total = text_size_estimate(path)
        self.sinks = {"spans": add_spans, "counters": add_counters}
        self.state = "starting"  # → reading (a cut was placed) | alone (no helper)
        self.helper_events = 0  # events read by the helper, once joined
        scratch.mkdir(parents=True, exist_ok=True)
        with open(scratch / "helper.log", "wb") as log:  # what the helper prints, if anything
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=log,
            )  # fmt: skip
        job = {"sys_path": [os.path.abspath(p) for p in sys.path], "path": str(path.resolve()),
               "rank": rank, "offset": offset, "flags": flags,
               "scratch": str(scratch.resolve())}  # fmt: skip
        self._send(job)

    def _send(self, message: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except OSError:  # the helper died: found when it is read
            pass

    def _receive(self, wait: bool) -> dict | None:
        if not wait and not select.select([self.proc.stdout], [], [], READY_WAIT_S)[0]:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else {"error": "the helper process exited"}

    def _alone(self) -> None:
        self.state = "alone"
        self._stop_helper()

    def between_batches(self, reader) -> None:
        stream = reader.stream
        if self.state == "starting":
            if reader._pending:  # a span waits for a flow: one process reads it all
                self._alone()
                return
            message = self._receive(wait=False)
            if message is None:
                return
            pos = stream.position
            cut = cut_after(pos, self.total) if "ready" in message else None
            if cut is None or self.total - pos < MIN_TAIL_CHARS:
                self._alone()
                return
            self._send({"start": cut})
            stream.stop_at(cut)
            self.state = "reading"
        elif self.state == "reading":
            if reader._pending:  # its flow may be one of those dropped below
                raise SplitReadFailed("a span waits for a flow event before the cut")
            # Flow events matter only to a span waiting for one, and any such span now
            # ends the split: none are kept (~250 bytes each).
            reader._flows.clear()

    def join(self, reader) -> None:
        """After this process's range: the helper's result merged into `reader` and its
        rows appended. Raises SplitReadFailed (or FastReadFailed: the fast front end
        cannot read the tail) when the result cannot be used."""
        if self.state != "reading":
            return
        message = self._receive(wait=True)
        if "done" not in message:
            if message.get("kind") == "fast":
                raise FastReadFailed(message.get("error", "the helper's range"))
            raise SplitReadFailed(message.get("error", "the helper failed"))
        done, stream = message["done"], reader.stream
        if stream.stopped_at is None:  # the array ended before the cut
            if done["events"]:
                raise SplitReadFailed("the helper read events past the end")
        elif done["first_at"] != stream.stopped_at:
            raise SplitReadFailed("the two ranges disagree on their boundary")
        stream.events_seen += done["events"]
        stream.header.update(done["header"])
        for name in ("spans_by_category", "skipped"):
            counts = getattr(reader, name)
            for key, n in done[name].items():
                counts[key] = counts.get(key, 0) + n
        reader.processes.update(done["processes"])
        reader.threads.update(done["threads"])
        reader.profiler_windows += [tuple(w) for w in done["profiler_windows"]]
        self.helper_events = done["events"]
        import pyarrow as pa

        for table in _TABLES:
            path = self.scratch / f"{table}.arrows"
            if path.exists():
                with pa.memory_map(str(path)) as source:
                    for batch in pa.ipc.open_stream(source):
                        self.sinks[table](batch)

    def _stop_helper(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()

    def close(self) -> None:
        self._stop_helper()
        shutil.rmtree(self.scratch, ignore_errors=True)


# -- the helper process ---------------------------------------------------------------------
class _TableFile:
    """A table's rows as an Arrow IPC stream file, in its storage schema."""

    def __init__(self, path: Path, schema):
        self.path, self.schema, self.rows, self.writer = path, schema, [], None

    def append(self, row: tuple) -> None:
        self.rows.append(row)
        if len(self.rows) >= 16384:
            self._flush()

    def append_batch(self, batch) -> None:
        self._flush()
        self._write(batch)

    def _flush(self) -> None:
        if self.rows:
            from ..schema import batch_from_rows

            self._write(batch_from_rows(self.rows, self.schema))
            self.rows = []

    def _write(self, batch) -> None:
        import pyarrow as pa

        if self.writer is None:
            self.writer = pa.ipc.new_stream(str(self.path), self.schema)
        self.writer.write_batch(batch)

    def close(self) -> None:
        self._flush()
        if self.writer is not None:
            self.writer.close()


class _SpanWaits(Exception):
    pass


class _Watch:
    """The helper's hook between batches: a span waiting for a flow ends the split."""

    @staticmethod
    def between_batches(reader) -> None:
        if reader._pending:
            raise _SpanWaits("a span waits for a flow event after the cut")
        reader._flows.clear()  # needed by waiting spans only, and none may wait

    @staticmethod
    def join(reader) -> None:
        pass


class _NoPandas:
    """A meta-path finder that makes `import pandas` fail (pyarrow then does without)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] == "pandas":
            raise ImportError("pandas is not used in the import's helper process")
        return None


def helper_main(job: dict) -> None:
    # pyarrow imports pandas on its first array conversion when it can (~0.2 s); the
    # helper never needs pandas.
    sys.meta_path.insert(0, _NoPandas())
    out = os.fdopen(os.dup(1), "w")  # the protocol's; anything else printed goes to the log
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(message: dict) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    try:
        from ..schema import STORAGE_SCHEMAS
        from .chrome_stream import TraceFormatError
        from .kineto_events import KinetoFileReader
        from .kineto_fast import read_fast
    except BaseException as e:  # reported: the importer reads alone
        send({"error": f"{type(e).__name__}: {e}"})
        return
    send({"ready": True})
    line = sys.stdin.readline()
    start = json.loads(line).get("start") if line else None
    if start is None:
        return
    scratch = Path(job["scratch"])
    files = {t: _TableFile(scratch / f"{t}.arrows", STORAGE_SCHEMAS[t]) for t in _TABLES}
    rank = job["rank"]
    reader = KinetoFileReader(
        job["path"], files["spans"].append, files["counters"].append,
        rank_of=lambda _h: rank, time_offset_ns=job["offset"],
        add_spans=files["spans"].append_batch, **job["flags"],
    )  # fmt: skip
    try:
        read_fast(reader, start=start, split=_Watch())
        for f in files.values():
            f.close()
    except (FastReadFailed, TraceFormatError) as e:
        send({"error": f"{type(e).__name__}: {e}", "kind": "fast"})
        return
    except BaseException as e:  # reported: the importer reads alone
        send({"error": f"{type(e).__name__}: {e}"})
        return
    stream = reader.stream
    send({"done": {
        "events": stream.events_seen, "first_at": stream.first_at, "header": stream.header,
        "spans_by_category": reader.spans_by_category, "skipped": reader.skipped,
        "processes": reader.processes, "threads": reader.threads,
        "profiler_windows": reader.profiler_windows,
    }})  # fmt: skip
