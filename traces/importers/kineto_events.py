"""Map Kineto (PyTorch profiler) trace events onto the run format's rows.

One `KinetoFileReader` turns the events of one trace file into `Span` and `Counter`
tuples. Conventions (see docs/timeline.md):
- timestamps are integer ns, converted from the decimal text of Kineto's µs values
  (`Decimal`, never a float: a float64 holds 1.7e15 µs only to 0.25 µs);
- a CPU span keeps `pid`/`tid`; a GPU span (kernel, copy, set, sync, GPU annotation)
  gets `device`/`stream` from its args (else from pid/tid) and no pid/tid;
- NCCL/RCCL kernels, `record_param_comms` and collective annotations (`nccl:*`,
  `gloo:*`) are category `comm`; a collective's `bytes` is its input message size;
- `correlation` comes from `args.correlation`; events without it are joined to their
  launch through the launch flow events, `ac2g` (older Kineto: `async_cpu_to_gpu`),
  binding by thread and start time;
- a perfdiag export read back (`perfdiag_export`) keeps what perfdiag wrote in each
  span's args: its `rank`, and `device`/`stream` for GPU work whose category Kineto does
  not have (`comm`, `annotation`, `triton`), so its kernels stay GPU work;
- `args` keeps the event's own args text as written (no re-encoding).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from decimal import Decimal, InvalidOperation

from .chrome_stream import ChromeTraceStream
from .kineto_structs import UNSET, Event, args_view, full_args, text_of
from .op_cost import op_cost

NO_STREAM = 2**32 - 1  # how Kineto writes a stream of -1 (uint32)

CPU, GPU = 0, 1

# Kineto category → (perfdiag span category, resource kind). Older Kineto versions wrote
# capitalised names; non-CUDA backends write `<backend>_runtime`.
CATEGORIES: dict[str, tuple[str, int]] = {
    "cpu_op": ("cpu_op", CPU),
    "operator": ("cpu_op", CPU),
    "python_function": ("python", CPU),
    "user_annotation": ("annotation", CPU),
    "cuda_runtime": ("cuda_runtime", CPU),
    "cuda_driver": ("cuda_driver", CPU),
    "privateuse1_runtime": ("cuda_runtime", CPU),
    "mtia_runtime": ("cuda_runtime", CPU),
    "runtime": ("cuda_runtime", CPU),
    "kernel": ("kernel", GPU),
    "gpu_memcpy": ("gpu_memcpy", GPU),
    "memcpy": ("gpu_memcpy", GPU),
    "gpu_memset": ("gpu_memset", GPU),
    "memset": ("gpu_memset", GPU),
    "cuda_sync": ("cuda_sync", GPU),
    "gpu_user_annotation": ("annotation", GPU),
}
SKIPPED_CATEGORIES = frozenset({"Trace"})  # the profiler's own window: kept in the manifest
# Categories whose spans take part in the launch ↔ GPU-work correlation join.
CORRELATED = frozenset({"cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "gpu_memset"})

_WS = re.compile(r"[ \t\n\r]*")
_COMM_KERNEL = re.compile(r"(?i)\b(?:void\s+)?[nr]ccl")
_COMM_ANNOTATION = re.compile(r"(?i)^(?:nccl|rccl|gloo|mpi|ucc|c10d):|^record_param_comms$")
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8,
    "float64": 8, "int": 4, "int32": 4, "long": 8, "int64": 8, "short": 2, "char": 1,
    "byte": 1, "bool": 1, "int8": 1, "uint8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}  # fmt: skip
LAUNCH_FLOWS = frozenset({"ac2g", "async_cpu_to_gpu", "async_gpu"})  # launch → GPU op
FLOW_WINDOW = 1 << 18
MAX_NS = 2**63 - 1  # the run format's int64 ns: anything beyond is not a time


def to_ns(value) -> int:
    """Kineto µs → integer ns, exactly: `value` is an int or the number's own text (the
    stream decodes floats as text); digits below the ns are rounded half-even."""
    if value.__class__ is int:
        return value * 1000
    if value.__class__ is str:
        dot = value.find(".")
        if dot != -1 and len(value) - dot <= 4 and "e" not in value and "E" not in value:
            # "123.456" µs (Kineto's form), or fewer decimals: its digits are the ns
            return int(value[:dot] + value[dot + 1 :].ljust(3, "0"))
        try:
            return int(Decimal(value).scaleb(3).to_integral_value())
        except InvalidOperation:
            raise TypeError(f"not a timestamp: {value!r}") from None
    if value.__class__ is Decimal or isinstance(value, float):
        return int(Decimal(value).scaleb(3).to_integral_value())
    raise TypeError(f"not a timestamp: {value!r}")


def _int(value) -> int | None:
    """An id, a count or a size: an int64, else None."""
    if value.__class__ is int:
        return value if -MAX_NS <= value <= MAX_NS else None
    number = None
    try:
        number = int(value, 0) if isinstance(value, str) else int(value)
    except (TypeError, ValueError, ArithmeticError):
        try:  # a float's text: "1.5e9"
            number = int(Decimal(value)) if isinstance(value, str) else None
        except (InvalidOperation, ValueError, ArithmeticError):
            return None
    return number if number is not None and -MAX_NS <= number <= MAX_NS else None


def _number(value) -> float | None:
    """A counter value: an int, or a float's text as the stream decoded it."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value) if isinstance(value, (int, float, str)) else None
    except (ValueError, OverflowError):
        return None
    return number if number is not None and math.isfinite(number) else None


_dumps = json.JSONEncoder(separators=(",", ":")).encode


def _bad_thread(pid, tid) -> str:
    """Why a CPU event's pid/tid is no thread id."""
    if any(v.__class__ is int and not -MAX_NS <= v <= MAX_NS for v in (pid, tid)):
        return "CPU event with a pid/tid beyond the int64 range"
    return "CPU event with a pid/tid that is not an integer"


def comm_bytes(nelems, dtype) -> int | None:
    """A collective's input message size from Kineto's record_param_comms args
    (`In msg nelems`, `dtype`)."""
    n = _int(nelems)
    size = _DTYPE_BYTES.get(str("" if dtype is None else dtype).lower())
    return n * size if n is not None and size else None


class FastReadFailed(Exception):
    """The fast front end cannot read this file (see `KinetoFileReader.read`)."""


class KinetoFileReader:
    """Reads one trace file, handing each row to `add_span` / `add_counter`.

    Two front ends feed one row builder (`_add`): the fast one decodes batches of events
    in native code (kineto_fast.py); the exact one (ChromeTraceStream, the stdlib
    scanner) reads anything the fast one refuses (NaN literals, `},{` inside strings at
    every cut, nesting too deep, ranges for parallel readers) and names the error in a
    malformed file."""

    def __init__(
        self,
        path,
        add_span,
        add_counter,
        *,
        rank_of,
        time_offset_ns: int = 0,
        perfdiag_export: bool = False,
        rank_from_args: bool = False,
        add_spans=None,
    ):
        """`rank_of(header)` names the rank (called once the first event is reached).
        `add_spans(record_batch)`: where the fast front end may hand whole batches of
        span rows (in the storage schema); without it every row goes to `add_span`.
        `perfdiag_export`: the file is perfdiag's own Chrome/TensorBoard export (its
        spans' args say where they ran); `rank_from_args`: a span's own `rank` arg wins
        over the file's rank (an export of several ranks in one file)."""
        self.add_span, self.add_counter, self.add_spans = add_span, add_counter, add_spans
        self.perfdiag_export = perfdiag_export
        self.rank_from_args = rank_from_args
        self.rank_of = rank_of
        self.offset = time_offset_ns
        self.stream = ChromeTraceStream(path)
        self.rank: int | None = None
        self.spans_by_category: dict[str, int] = {}
        self.skipped: dict[str, int] = {}
        self.processes: dict[str, dict] = {}
        self.threads: dict[str, str] = {}
        self.profiler_windows: list[tuple[int, int]] = []
        self.flows_linked = 0
        self.unresolved = 0  # GPU ops and launches left without a correlation id
        self.front_end = "exact"
        self._flows: dict[tuple, int] = {}
        self._pending: list[tuple[tuple, tuple]] = []  # spans waiting for a flow

    def _skip(self, what: str) -> None:
        self.skipped[what] = self.skipped.get(what, 0) + 1

    def _start(self) -> None:
        """Called as the events begin: the header before them names the rank."""
        self.rank = self.rank_of(self.stream.header)

    def read(
        self, *, start: int = 0, stop: int | None = None, fast: bool = False, split=None
    ) -> None:
        """Read the file (or the character range of its events, see ChromeTraceStream).
        `fast`: through the native decoder (whole files only, its tail perhaps by a
        helper process: `split`, see kineto_split.py); raises FastReadFailed when it
        cannot read the file, after which the caller discards what it was handed and
        reads again with `fast=False`."""
        if fast and start == 0 and stop is None:
            from .kineto_fast import read_fast  # imports this module: loaded when used

            read_fast(self, split=split)
            return
        self._read_exact(start, stop)

    def _read_exact(self, start: int, stop: int | None) -> None:
        events = self.stream.events(on_start=self._start, start=start, stop=stop)
        first = next(events, None)
        if self.rank is None:
            self._start()
        stream, batch, views, texts = self.stream, [], [], []
        for ev in itertools.chain(() if first is None else (first,), events):
            args = ev.get("args")
            view = text = None
            if ev.get("ph") == "X":
                if args.__class__ is not dict:
                    args = {}
                view = args_view(args)
                text = self._args_text(args) if args else None
            get = ev.get
            batch.append(Event(get("ph"), get("name"), get("cat"), get("ts"), get("dur"),
                               get("pid"), get("tid"), get("id"), args))  # fmt: skip
            views.append(view)
            texts.append(text)
            if len(batch) >= 4096:
                self._add(batch, views, texts)
                batch, views, texts = [], [], []
        self._add(batch, views, texts)
        self.finish()
        if stream.too_deep:
            self.skipped["event nested too deeply to decode"] = stream.too_deep

    def _args_text(self, args: dict) -> str:
        """The args object's own text, as written (no re-encoding). Kineto writes it last,
        so it runs from the "args" key to the event's closing brace; else the scanner
        finds where it ends."""
        stream = self.stream
        buf, a, b = stream.buf, stream.value_start, stream.value_end
        k = buf.find('"args"', a, b)
        if k != -1:
            colon = buf.find(":", k + 6, b)
            if buf[b - 1] == "}":
                text = buf[colon + 1 : b - 1].strip()
                if text[:1] == "{" and text[-1:] == "}":
                    return text
            m = _WS.match(buf, colon + 1)
            try:
                value, end = stream.scan_once(buf, m.end())
            except (StopIteration, ValueError, RecursionError):
                value = None
            if value == args:
                return buf[m.end() : end]
        return _dumps(args)  # "args" not found as a key (escaped in a string): re-encoded

    def finish(self) -> None:
        """After the last batch: the spans that waited for a flow event."""
        self._resolve_pending()

    def _add(self, events: list, views: list, texts: list) -> None:
        """The row builder: one pass over a batch of events. `views[i]` is an X event's
        Args (NO_ARGS when its args are empty or not an object), `texts[i]` its args
        text (None when empty)."""
        add_span, other, span_row = self.add_span, self._other, self._span_row
        pending, flows = self._pending, self._flows
        for ev, args, text in zip(events, views, texts, strict=True):
            ph = ev.ph
            if ph != "X":
                if ph == "f" or ph == "s":
                    flow_cat = ev.cat
                    if flow_cat == "ac2g" or (
                        flow_cat.__class__ is str and flow_cat in LAUNCH_FLOWS
                    ):
                        # Raw (pid, tid, ts) as the key: no conversion for the many flows
                        # that nothing will look up.
                        try:
                            flows[(ev.pid, ev.tid, ev.ts)] = ev.id
                        except TypeError:  # a list or an object where a number belongs
                            self._skip("flow event with a malformed pid/tid/ts")
                            continue
                        if len(flows) > FLOW_WINDOW and not pending:
                            flows.clear()  # Kineto writes each flow beside its span
                    else:
                        self._skip(f"{ev.cat} flow")
                    continue
                other(ev, ph, full_args(ev.args))
                continue
            got = span_row(ev, args, text)
            if got is None:
                continue
            row, waits = got
            if waits:  # its launch is named by a flow event: joined at the end
                pending.append((row, (ev.pid, ev.tid, ev.ts)))
                continue
            add_span(row)

    def _span_row(self, ev, args, text):
        """An X event's span row and whether it waits for a flow event to name its
        launch; None when the event is skipped (counted in `skipped`)."""
        offset, rank, categories = self.offset, self.rank, CATEGORIES
        export, rank_from_args = self.perfdiag_export, self.rank_from_args
        name = ev.name
        if name.__class__ is not str:
            name = "" if name is None else str(name)
        if not name.isascii():
            name = text_of(name)
        ts = ev.ts
        dur = ev.dur
        if dur is None:  # never a zero-length span by default
            self._skip("X event without dur")
            return None
        try:
            # Kineto's "123.456" µs: its digits are the ns. Else ints, else exact decimals.
            if ts.__class__ is str and ts[-4:-3] == ".":
                start = int(ts.replace(".", "")) + offset
            else:
                start = (ts * 1000 if ts.__class__ is int else to_ns(ts)) + offset
            if dur.__class__ is str and dur[-4:-3] == ".":
                dur = int(dur.replace(".", ""))
            else:
                dur = dur * 1000 if dur.__class__ is int else to_ns(dur)
        except ValueError:  # "12.5e3" passed the quick test: take the exact path
            try:
                start, dur = to_ns(ts) + offset, to_ns(dur)
            except (TypeError, ValueError, ArithmeticError):  # NaN, Infinity, "abc"
                self._skip("X event without a numeric ts/dur")
                return None
        except (TypeError, ArithmeticError):
            self._skip("X event without a numeric ts/dur")
            return None
        if not (-MAX_NS <= start - offset <= MAX_NS and dur <= MAX_NS):
            self._skip("X event with ts/dur beyond the int64 ns range")
            return None
        if start - offset < 0:
            self._skip("X event with a negative ts")
            return None
        if dur < 0:  # an op still open when the profiler stopped
            self._skip("negative duration (set to 0)")
            dur = 0
        cat = ev.cat
        if cat.__class__ is not str:
            cat = None if cat is None else "other"  # a number, a list: not a category
        mapped = categories.get(cat)
        if mapped is None:
            if cat in SKIPPED_CATEGORIES:
                self.profiler_windows.append((start, start + dur))
                return None
            category, kind = (text_of(str(cat)) if cat else "other"), CPU
        else:
            category, kind = mapped
        corr = args.correlation
        if corr is not None:
            corr = _int(corr)  # a text, or an int beyond int64: none
        nbytes = flops = None
        row_rank = rank
        if export:
            device = args.device
            if mapped is None and device is not UNSET and _int(device) is not None:
                kind = GPU  # perfdiag's comm/annotation/triton on a GPU queue
            if rank_from_args and (r := _int(args.rank)) is not None:
                row_rank = r
        if kind == GPU:
            pid = tid = None
            device = args.device
            if device is UNSET:
                device = ev.pid
            device = _int(device)  # an int beyond int64 too: none
            queue = args.stream
            if queue is UNSET:
                queue = ev.tid
            queue = _int(queue)
            if queue == NO_STREAM:  # a context-wide sync: on no stream (CUDA's -1)
                queue = None
            if category == "kernel":
                if _COMM_KERNEL.match(name):
                    category = "comm"
                    nbytes = comm_bytes(args.in_msg_nelems, args.dtype)
            elif category == "gpu_memcpy" or category == "gpu_memset":
                nbytes = None if args.bytes is UNSET else _int(args.bytes)
        else:
            pid, tid = ev.pid, ev.tid
            if (
                pid.__class__ is not int
                or tid.__class__ is not int
                or not (-MAX_NS <= pid <= MAX_NS and -MAX_NS <= tid <= MAX_NS)
            ):
                pid, tid = _int(pid), _int(tid)
                if (pid is None) != (ev.pid is None) or (tid is None) != (ev.tid is None):
                    self._skip(_bad_thread(ev.pid, ev.tid))
                    return None
            device = queue = None
            if category == "cpu_op" or category == "annotation":
                if _COMM_ANNOTATION.match(name):
                    category = "comm"
                    nbytes = comm_bytes(args.in_msg_nelems, args.dtype)
                elif args.flops is not UNSET:
                    flops = _int(args.flops)
                elif args.input_dims is not UNSET:  # a CPU torch writes shapes, not flops
                    flops, nbytes = op_cost(name, full_args(ev.args))
        if export:  # its own figures, whatever the category
            flops = flops if args.flops is UNSET else _int(args.flops)
            nbytes = nbytes if args.bytes is UNSET else _int(args.bytes)
        row = (
            name, category, start, dur, pid, tid, device, queue, row_rank, None, corr,
            flops, nbytes, text,
        )  # fmt: skip
        by_cat = self.spans_by_category
        by_cat[category] = by_cat.get(category, 0) + 1
        return row, corr is None and (
            category in CORRELATED or (category == "comm" and kind == GPU)
        )

    def _other(self, ev, ph, args: dict) -> None:
        if ph == "M":
            self._metadata(ev, args)
        elif ph == "C":
            self._counter(ev, args)
        elif ph in ("i", "I") and ev.name == "[memory]":
            self._memory(ev, args)
        else:
            self._skip(f"ph={ph} event")

    def _metadata(self, ev, args: dict) -> None:
        what, pid = ev.name, str(ev.pid)
        if what == "process_name":
            self.processes.setdefault(pid, {})["name"] = args.get("name")
        elif what == "process_labels":
            self.processes.setdefault(pid, {})["labels"] = args.get("labels")
        elif what == "thread_name":
            self.threads[f"{pid}/{ev.tid}"] = args.get("name")

    def _counter(self, ev, args: dict):
        try:
            ts = to_ns(ev.ts) + self.offset
        except (TypeError, ValueError, ArithmeticError):
            self._skip("counter without ts")
            return
        if not 0 <= ts - self.offset <= MAX_NS:
            self._skip("counter with ts out of range")
            return
        name = "counter" if ev.name is None else str(ev.name)
        scope = text_of(f"pid{ev.pid}")
        for key, value in args.items():
            number = _number(value)
            if number is not None:
                label = name if len(args) == 1 else f"{name}.{key}"
                self.add_counter((text_of(label), ts, number, scope))

    def _memory(self, ev, args: dict):
        try:
            ts = to_ns(ev.ts) + self.offset
        except (TypeError, ValueError, ArithmeticError):
            self._skip("memory event without ts")
            return
        if not 0 <= ts - self.offset <= MAX_NS:
            self._skip("memory event with ts out of range")
            return
        device = _int(args.get("Device Id"))
        # Kineto's Device Type: 0 CPU, 1 CUDA (and other accelerators above).
        scope = "cpu" if args.get("Device Type") == 0 else f"gpu{device}"
        for key, label in (
            ("Total Allocated", "memory_allocated_bytes"),
            ("Total Reserved", "memory_reserved_bytes"),
        ):
            value = _number(args.get(key))
            if value is not None:
                self.add_counter((label, ts, value, scope))

    def _resolve_pending(self) -> None:
        if not self._pending:
            self._flows.clear()
            return
        # Flows were kept by their raw (pid, tid, ts); match on exact ns.
        flows = {}
        for (pid, tid, ts), flow_id in self._flows.items():
            try:
                flows[(_int(pid), _int(tid), to_ns(ts))] = flow_id
            except (TypeError, ValueError, ArithmeticError):
                continue
        for row, (pid, tid, ts) in self._pending:
            try:
                key = (_int(pid), _int(tid), to_ns(ts))
            except (TypeError, ValueError, ArithmeticError):
                key = None
            corr = _int(flows.get(key))
            if corr is None:
                self.unresolved += 1
            else:
                self.flows_linked += 1
                row = (*row[:10], corr, *row[11:])
            self.add_span(row)
        self._pending.clear()
        self._flows.clear()
