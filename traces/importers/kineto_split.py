"""Large traces read by two processes with the fast front end: the importing process
reads each from its start, a helper process reads its tail, and they meet where they agree.

Decoding is the import's cost and holds the GIL, so a second core can only help from
another process. One helper serves an import's large files, one at a time (`Helper`). It
is forked before the run's writer exists when the process runs no other Python thread (a
fork is ready in ~3 ms and shares the loaded modules); otherwise it is a fresh
interpreter, never a fork of threads that may hold locks, and not multiprocessing's
spawn, which would import the caller's main module again: that one is ready after
~0.25 s of imports. For each file the importing process reads on until the helper is
ready, then places the cut so that both finish together: half of what is left, moved
for the helper's cost of skipping the text before its range.

The helper writes its rows to Arrow IPC files in a scratch directory (a pipe would stall
it whenever this process is busy decoding), and this process appends them after its own:
the run's rows, their order and its counts are those of a one-process read
(tests/test_kineto_split.py).

It gives up (SplitReadFailed: the caller reads the files in one process) when the helper
fails, when the two disagree on the cut (a `},{` inside a string fooled the search), or
when a span waits for a flow event (its flow may sit in the other range; if that is seen
before the cut is placed, this process simply reads on alone). A helper that is not
ready before this process is nearly done is not used for that file.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pyarrow as pa

from ..environment import machine_cores
from ..schema import STORAGE_SCHEMAS
from .chrome_stream import TraceFormatError
from .kineto_events import FastReadFailed, KinetoFileReader
from .kineto_parallel import RowBatcher, text_size_estimate

SPLIT_MIN_CHARS = 16 << 20  # below ~75k events the hand-over costs what the helper saves
MIN_TAIL_CHARS = 4 << 20  # the least left to hand over when the helper is ready
# Per character, against the helper's cost of decoding one into rows: the helper's cost
# of one it skips (decompressed and dropped), and this process's of one it decodes (it
# also writes its rows to the run as it goes). Measured on the shared V100 trace's text:
# with the two equal, the helper finished ~10 % early.
SKIP_COST = 0.1
MAIN_COST = 1.1
READY_WAIT_S = 0.0  # how long to wait for the helper between batches (tests: long)
FORK = True  # fork the helper when it is safe (tests: False tries the fresh interpreter)
_BOOT = (
    "import json, sys; i = sys.stdin.buffer; sys.path[:0] = json.loads(i.readline()); "
    f"from {__name__} import serve; serve(i, 1)"
)
_TABLES = ("spans", "counters")


class SplitReadFailed(Exception):
    """The split read cannot be trusted: read the file in one process instead."""


def plan_split(path: Path, jobs: int | None) -> bool:
    """Whether a helper process should read `path`'s tail (`jobs`: 1 forbids it)."""
    if jobs is not None and jobs <= 1:
        return False
    return machine_cores() >= 2 and text_size_estimate(path) >= SPLIT_MIN_CHARS


def cut_after(pos: int, total: int) -> int | None:
    """Where to cut when the helper is ready and this process is at character `pos` of
    `total`: this process decodes a share a of what is left (R), the helper skips up to
    the cut and decodes the rest; MAIN_COST·a·R = SKIP_COST·(pos + a·R) + (1 − a)·R. None
    when the helper would read less than a tenth of the rest: not worth the hand-over."""
    left = total - pos
    if left <= 0:
        return None
    share = (left + SKIP_COST * pos) / ((1 + MAIN_COST - SKIP_COST) * left)
    return pos + int(share * left) if share <= 0.9 else None


def _single_threaded() -> bool:
    """No Python thread but this one: no lock a fork's child could find held (a
    library's thread, say tqdm's monitor, rules the fork out)."""
    return threading.active_count() == 1


class Helper:
    """The helper process of one import: reads the tail of one file per job it is sent
    (`serve`). Start it before the run's writer (whose thread rules out a fork).
    `close()` always."""

    def __init__(self):
        self.ready = False  # idle, waiting for a job
        self.dead = self.closed = False
        # Linux only: elsewhere system libraries are not fork-safe (macOS's frameworks).
        self.forked = FORK and sys.platform.startswith("linux") and _single_threaded()
        if self.forked:
            from . import kineto_fast  # noqa: F401 - loaded once, shared with the fork

            from_parent, to_child = os.pipe()  # (read end, write end)
            from_child, to_parent = os.pipe()
            with warnings.catch_warnings():  # 3.12+: native pools (BLAS) count as threads
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:  # the helper: never returns into the importer's code
                code = 1
                try:
                    os.close(to_child)
                    os.close(from_child)
                    serve(os.fdopen(from_parent, "rb"), to_parent)
                    code = 0
                finally:
                    os._exit(code)
            os.close(from_parent)
            os.close(to_parent)
            self.pid, self.stdin = pid, os.fdopen(to_child, "wb")
            self.stdout = os.fdopen(from_child, "rb")
        else:
            # Its errors come back as messages; nothing it might print reaches the user.
            pipe = subprocess.PIPE
            self.proc = subprocess.Popen([sys.executable, "-c", _BOOT], stdin=pipe, stdout=pipe,
                                         stderr=subprocess.DEVNULL)  # fmt: skip
            self.pid, self.stdin, self.stdout = self.proc.pid, self.proc.stdin, self.proc.stdout
            self.send([os.path.abspath(p) for p in sys.path])

    def send(self, message) -> None:
        try:
            self.stdin.write(json.dumps(message).encode() + b"\n")
            self.stdin.flush()
        except OSError:  # it died: found when it is read
            pass

    def receive(self, wait: float | None) -> dict | None:
        """The helper's next message (None: none within `wait` seconds; None waits)."""
        if wait is not None and not select.select([self.stdout], [], [], wait)[0]:
            return None
        line = self.stdout.readline()
        if not line:
            self.dead = True
            return {"error": "the helper process exited"}
        return json.loads(line)

    def close(self) -> None:
        """Stop it, whatever it is doing (an unfinished job's files are the caller's to
        remove), and reap it. Once."""
        if self.closed:
            return
        self.closed = self.dead = True
        for f in (self.stdin, self.stdout):
            with contextlib.suppress(OSError):
                f.close()
        if self.forked:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        else:
            self.proc.kill()
            self.proc.wait()


class SplitRead:
    """One file's split: places the cut between two of this process's batches
    (`between_batches`), then checks and appends the helper's rows (`join`). `close()`
    always: it removes the scratch directory."""

    def __init__(self, helper: Helper, path: Path, *, rank, offset: int, flags: dict,
                 scratch: Path, add_spans, add_counters):  # fmt: skip
        self.helper, self.scratch = helper, scratch
        self.total = text_size_estimate(path)
        self.sinks = {"spans": add_spans, "counters": add_counters}
        self.state = "starting"  # → reading (a cut was placed) | alone (no helper)
        self.helper_events = 0  # events read by the helper, once joined
        scratch.mkdir(parents=True, exist_ok=True)
        self.job = {"path": str(path.resolve()), "rank": rank, "offset": offset,
                    "flags": flags, "scratch": str(scratch.resolve())}  # fmt: skip

    def between_batches(self, reader) -> None:
        stream, helper = reader.stream, self.helper
        if self.state == "starting":
            if reader._pending or helper.dead:  # a span waits for a flow: read it all here
                self.state = "alone"
                return
            if not helper.ready:
                message = helper.receive(wait=READY_WAIT_S)
                if message is None:
                    return
                if "ready" not in message:  # it could not start
                    helper.close()
                    self.state = "alone"
                    return
                helper.ready = True
            pos = stream.position
            cut = cut_after(pos, self.total)
            if cut is None or self.total - pos < MIN_TAIL_CHARS:
                self.state = "alone"
                return
            helper.send({**self.job, "start": cut})
            helper.ready = False
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
        message = self.helper.receive(wait=None)
        self.helper.ready = not self.helper.dead  # it answered: idle again
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
        for table in _TABLES:
            path = self.scratch / f"{table}.arrows"
            if path.exists():
                with pa.memory_map(str(path)) as source:
                    for batch in pa.ipc.open_stream(source):
                        self.sinks[table](batch)

    def close(self) -> None:
        if self.state == "reading" and not self.helper.dead and not self.helper.ready:
            self.helper.close()  # stopped mid-job (an error here): it cannot serve again
        shutil.rmtree(self.scratch, ignore_errors=True)


# -- the helper process ---------------------------------------------------------------------
class _IpcFile:
    """Record batches written to an Arrow IPC stream file (created with the first)."""

    def __init__(self, path: Path, schema: pa.Schema):
        self.path, self.schema, self.writer = path, schema, None

    def write(self, batch: pa.RecordBatch) -> None:
        if self.writer is None:
            self.writer = pa.ipc.new_stream(str(self.path), self.schema)
        self.writer.write_batch(batch)

    def close(self) -> None:
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


def serve(inp, out_fd: int) -> None:
    """The helper's loop: says it is ready, then reads one file's tail per job line of
    `inp` (binary) and answers each on `out_fd`, until `inp` ends."""
    if out_fd == 1:  # a fresh interpreter: the protocol owns the real stdout
        out = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)  # anything else printed goes to the log
        sys.stdout = sys.stderr
    else:
        out = os.fdopen(out_fd, "w")
    if "pandas" not in sys.modules:
        # pyarrow imports pandas on its first array conversion when it can (~0.2 s);
        # the helper never needs it.
        sys.meta_path.insert(0, _NoPandas())

    def send(message: dict) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    try:
        from . import kineto_fast  # noqa: F401 - what a job needs, loaded before "ready"
    except BaseException as e:  # reported: the importer reads alone
        send({"error": f"{type(e).__name__}: {e}"})
        return
    send({"ready": True})
    for line in inp:
        send(_read_tail(json.loads(line)))


def _read_tail(job: dict) -> dict:
    """One job: the file's events from character `start` on, as the one-process read
    would have handed them on (rows in the scratch directory's IPC files)."""
    from .kineto_fast import read_fast  # which imports this module: loaded when used

    scratch = Path(job["scratch"])
    files = {t: _IpcFile(scratch / f"{t}.arrows", STORAGE_SCHEMAS[t]) for t in _TABLES}
    tables = {t: RowBatcher(t, files[t].write) for t in _TABLES}
    rank = job["rank"]
    reader = KinetoFileReader(
        job["path"], tables["spans"].append, tables["counters"].append,
        rank_of=lambda _h: rank, time_offset_ns=job["offset"],
        add_spans=tables["spans"].append_batch, **job["flags"],
    )  # fmt: skip
    try:
        read_fast(reader, start=job["start"], split=_Watch())
        for t in _TABLES:
            tables[t].flush()
            files[t].close()
    except (FastReadFailed, TraceFormatError) as e:
        return {"error": f"{type(e).__name__}: {e}", "kind": "fast"}
    except Exception as e:  # reported: the importer reads alone
        return {"error": f"{type(e).__name__}: {e}"}
    stream = reader.stream
    return {"done": {
        "events": stream.events_seen, "first_at": stream.first_at, "header": stream.header,
        "spans_by_category": reader.spans_by_category, "skipped": reader.skipped,
        "processes": reader.processes, "threads": reader.threads,
        "profiler_windows": reader.profiler_windows,
    }}  # fmt: skip
