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
        if dot != -1 and len(value) - dot == 4 and "e" not in value and "E" not in value:
            return int(value[:dot] + value[dot + 1 :])  # the common "123.456" µs form
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


def comm_bytes(args: dict) -> int | None:
    """A collective's input message size from Kineto's record_param_comms args."""
    n = _int(args.get("In msg nelems"))
    size = _DTYPE_BYTES.get(str(args.get("dtype", "")).lower())
    return n * size if n is not None and size else None


class KinetoFileReader:
    """Reads one trace file, handing each row to `add_span` / `add_counter`."""

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
    ):
        """`rank_of(header)` names the rank (called once the first event is reached).
        `perfdiag_export`: the file is perfdiag's own Chrome/TensorBoard export (its
        spans' args say where they ran); `rank_from_args`: a span's own `rank` arg wins
        over the file's rank (an export of several ranks in one file)."""
        self.add_span, self.add_counter = add_span, add_counter
        self.perfdiag_export = perfdiag_export
        self.rank_from_args = rank_from_args
        self.stream = ChromeTraceStream(path)
        self.rank_of = rank_of
        self.rank: int | None = None
        self.offset = time_offset_ns
        self.spans_by_category: dict[str, int] = {}
        self.skipped: dict[str, int] = {}
        self.processes: dict[str, dict] = {}
        self.threads: dict[str, str] = {}
        self.profiler_windows: list[tuple[int, int]] = []
        self.flows_linked = 0
        self.unresolved = 0  # GPU ops and launches left without a correlation id
        self._flows: dict[tuple, int] = {}
        self._pending: list[tuple[tuple, tuple]] = []  # spans waiting for a flow

    def _skip(self, what: str) -> None:
        self.skipped[what] = self.skipped.get(what, 0) + 1

    def _args_fallback(self, args: dict) -> str:
        """Rare: args not written last. Decode the event again, with real floats."""
        stream = self.stream
        event = json.loads(stream.buf[stream.value_start : stream.value_end])
        return _dumps(event.get("args", args))

    def _start(self) -> None:
        """Called as the events begin: the header before them names the rank."""
        self.rank = self.rank_of(self.stream.header)

    def read(self, *, start: int = 0, stop: int | None = None) -> None:
        """Read the file (or the character range of its events, see ChromeTraceStream)."""
        events = self.stream.events(on_start=self._start, start=start, stop=stop)
        first = next(events, None)
        if self.rank is None:
            self._start()
        rank = self.rank
        offset, add_span, other = self.offset, self.add_span, self._other
        categories, by_cat, pending = CATEGORIES, self.spans_by_category, self._pending
        stream, flows, fallback = self.stream, self._flows, self._args_fallback
        export, rank_from_args = self.perfdiag_export, self.rank_from_args
        # The hot loop (one pass per event): plain ints take the fast path, anything
        # else goes through to_ns/_int.
        for ev in itertools.chain(() if first is None else (first,), events):
            ph = ev.get("ph")
            if ph != "X":
                if ph == "f" or ph == "s":
                    flow_cat = ev.get("cat")
                    if flow_cat == "ac2g" or (
                        flow_cat.__class__ is str and flow_cat in LAUNCH_FLOWS
                    ):
                        # Raw (pid, tid, ts) as the key: no conversion for the many flows
                        # that nothing will look up.
                        try:
                            flows[(ev.get("pid"), ev.get("tid"), ev.get("ts"))] = ev.get("id")
                        except TypeError:  # a list or an object where a number belongs
                            self._skip("flow event with a malformed pid/tid/ts")
                            continue
                        if len(flows) > FLOW_WINDOW and not pending:
                            flows.clear()  # Kineto writes each flow beside its span
                    else:
                        self._skip(f"{ev.get('cat')} flow")
                    continue
                other(ev, ph)
                continue
            name = ev.get("name")
            if name.__class__ is not str:
                name = "" if name is None else str(name)
            ts = ev.get("ts")
            dur = ev.get("dur")
            if dur is None:  # never a zero-length span by default
                self._skip("X event without dur")
                continue
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
                    continue
            except (TypeError, ArithmeticError):
                self._skip("X event without a numeric ts/dur")
                continue
            if not (-MAX_NS <= start - offset <= MAX_NS and dur <= MAX_NS):
                self._skip("X event with ts/dur beyond the int64 ns range")
                continue
            if start - offset < 0:
                self._skip("X event with a negative ts")
                continue
            if dur < 0:  # an op still open when the profiler stopped
                self._skip("negative duration (set to 0)")
                dur = 0
            cat = ev.get("cat")
            if cat.__class__ is not str:
                cat = None if cat is None else "other"  # a number, a list: not a category
            mapped = categories.get(cat)
            if mapped is None:
                if cat in SKIPPED_CATEGORIES:
                    self.profiler_windows.append((start, start + dur))
                    continue
                category, kind = (str(cat) if cat else "other"), CPU
            else:
                category, kind = mapped
            args = ev.get("args")
            if args.__class__ is not dict:
                args = {}
            corr = args.get("correlation")
            if corr is not None and corr.__class__ is not int:
                corr = _int(corr)
            nbytes = flops = None
            row_rank = rank
            if export:
                if mapped is None and _int(args.get("device")) is not None:
                    kind = GPU  # perfdiag's comm/annotation/triton on a GPU queue
                if rank_from_args and (r := _int(args.get("rank"))) is not None:
                    row_rank = r
            if kind == GPU:
                pid = tid = None
                device = args.get("device", ev.get("pid"))
                if device.__class__ is not int:
                    device = _int(device)
                queue = args.get("stream", ev.get("tid"))
                if queue.__class__ is not int:
                    queue = _int(queue)
                if queue == NO_STREAM:  # a context-wide sync: on no stream (CUDA's -1)
                    queue = None
                if category == "kernel":
                    if _COMM_KERNEL.match(name):
                        category = "comm"
                        nbytes = comm_bytes(args)
                elif category == "gpu_memcpy" or category == "gpu_memset":
                    nbytes = _int(args.get("bytes"))
            else:
                pid, tid = ev.get("pid"), ev.get("tid")
                if pid.__class__ is not int or tid.__class__ is not int:
                    pid, tid = _int(pid), _int(tid)
                    if (pid is None) != (ev.get("pid") is None) or (tid is None) != (
                        ev.get("tid") is None
                    ):
                        self._skip("CPU event with a pid/tid that is not an integer")
                        continue
                device = queue = None
                if category == "cpu_op" or category == "annotation":
                    if _COMM_ANNOTATION.match(name):
                        category = "comm"
                        nbytes = comm_bytes(args)
                    elif "flops" in args:
                        flops = _int(args["flops"])
                    elif "Input Dims" in args:  # a CPU torch writes shapes, not flops
                        flops, nbytes = op_cost(name, args)
            text = None
            if args:
                # The args object's own text: Kineto writes it last, so it runs from the
                # "args" key to the event's closing brace. No re-encoding.
                buf, a, b = stream.buf, stream.value_start, stream.value_end
                k = buf.find('"args"', a, b)
                if k != -1 and buf[b - 1] == "}":
                    text = buf[buf.find(":", k + 6, b) + 1 : b - 1].strip()
                if text is None or text[:1] != "{" or text[-1:] != "}":
                    text = fallback(args)
            if export:  # its own figures, whatever the category
                flops = _int(args["flops"]) if "flops" in args else flops
                nbytes = _int(args["bytes"]) if "bytes" in args else nbytes
            row = (
                name, category, start, dur, pid, tid, device, queue, row_rank, None, corr,
                flops, nbytes, text,
            )  # fmt: skip
            by_cat[category] = by_cat.get(category, 0) + 1
            if corr is None and (category in CORRELATED or (category == "comm" and kind == GPU)):
                pending.append((row, (ev.get("pid"), ev.get("tid"), ev.get("ts"))))
                continue
            add_span(row)
        self._resolve_pending()
        if stream.too_deep:
            self.skipped["event nested too deeply to decode"] = stream.too_deep

    def _other(self, ev: dict, ph) -> None:
        if ph == "M":
            self._metadata(ev)
        elif ph == "C":
            self._counter(ev)
        elif ph in ("i", "I") and ev.get("name") == "[memory]":
            self._memory(ev)
        else:
            self._skip(f"ph={ph} event")

    def _metadata(self, ev: dict) -> None:
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        what, pid = ev.get("name"), str(ev.get("pid"))
        if what == "process_name":
            self.processes.setdefault(pid, {})["name"] = args.get("name")
        elif what == "process_labels":
            self.processes.setdefault(pid, {})["labels"] = args.get("labels")
        elif what == "thread_name":
            self.threads[f"{pid}/{ev.get('tid')}"] = args.get("name")

    def _counter(self, ev: dict):
        try:
            ts = to_ns(ev["ts"]) + self.offset
        except (KeyError, TypeError, ValueError, ArithmeticError):
            self._skip("counter without ts")
            return
        if not 0 <= ts - self.offset <= MAX_NS:
            self._skip("counter with ts out of range")
            return
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        name = str(ev.get("name", "counter"))
        for key, value in args.items():
            number = _number(value)
            if number is not None:
                label = name if len(args) == 1 else f"{name}.{key}"
                self.add_counter((label, ts, number, f"pid{ev.get('pid')}"))

    def _memory(self, ev: dict):
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        try:
            ts = to_ns(ev["ts"]) + self.offset
        except (KeyError, TypeError, ValueError, ArithmeticError):
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
