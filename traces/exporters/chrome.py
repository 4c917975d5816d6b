"""Chrome JSON sink (Trace Event Format) for chrome://tracing, Perfetto's JSON loader and
the tools that read Kineto-style traces.

- Streaming: events are formatted as text and written every `chunk_events` events; the
  document is never built in memory.
- Exact nanoseconds: `ts` and `dur` are µs, written from integer ns as decimal text with
  three decimals (`1234.567`), never through a float. They are relative to
  `baseTimeNanoseconds` (Kineto's key; the run's first second), so a float64 reader still
  resolves 1 ns: ts_ns = baseTimeNanoseconds + ts × 1000, exactly.
- Layout: a group is a process (`process_name`, `process_sort_index`), a track a thread
  (`thread_name`, `thread_sort_index`); slices are complete events (X), counters C
  (one series, keyed by the unit), findings instants (i), flows s/f pairs bound to the
  enclosing slices (`bp: e`).
- Arguments: perfdiag's own fields, plus the span's recorded args object spliced in as
  text (an importer keeps the source's args verbatim), so Kineto readers find
  `correlation`, `External id`, `device`, `stream` where they expect them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TextIO

from .sink import FLOW_NAMES, Args, TraceInfo, flow_kind
from .tracks import COUNTER, GROUP, Track

CHUNK_EVENTS = 8192
_dumps = json.dumps


def us_text(ns: int) -> str:
    """Non-negative integer ns as exact µs text: 1234567 -> '1234.567'."""
    return f"{ns // 1000}.{ns % 1000:03d}"


class ChromeSink:
    def __init__(
        self, file: TextIO, chunk_events: int = CHUNK_EVENTS, extra_header: dict | None = None
    ):
        self._file = file
        self._chunk = chunk_events
        self._buf: list[str] = []
        self._base = 0
        self._header = extra_header or {}
        self._quoted: dict[str, str] = {}
        self._first = True
        self.events = 0
        self.base_ns = 0

    def begin(self, info: TraceInfo) -> None:
        first = info.first_ns or 0
        self._base = self.base_ns = max(0, first - first % 1_000_000_000)
        other = {"run_id": info.run_id, "source": info.source, **info.metadata}
        if info.wall_at(self._base) is not None:
            other["wall_ns_at_base"] = info.wall_at(self._base)
        header = {
            "displayTimeUnit": "ns",
            "baseTimeNanoseconds": self._base,
            **self._header,
            "otherData": other,
        }
        # The header first: a streaming reader knows the rank and the time base before
        # the first event (perfdiag's importer needs no second pass for them).
        self._file.write(_dumps(header)[:-1] + ',"traceEvents":[\n')

    def declare(self, track: Track) -> None:
        if track.kind == GROUP:
            self._meta("process_name", track.pid, 0, "name", track.name)
            self._meta("process_sort_index", track.pid, 0, "sort_index", track.order)
        elif track.kind != COUNTER:
            self._meta("thread_name", track.pid, track.tid, "name", track.name)
            self._meta("thread_sort_index", track.pid, track.tid, "sort_index", track.order)

    def slice(
        self,
        track: Track,
        start: int,
        dur: int,
        name: str,
        cat: str,
        args: Args | None = None,
        raw_args: str | None = None,
        flows_out: Sequence[int] = (),
        flows_in: Sequence[int] = (),
    ) -> None:
        ts = us_text(start - self._base)
        where = f'"pid":{track.pid},"tid":{track.tid},"ts":{ts}'
        self._emit(
            f'{{"ph":"X","cat":{self._q(cat)},"name":{self._q(name)},{where},'
            f'"dur":{us_text(dur)},"args":{_args_text(args, raw_args)}}}'
        )
        for fid in flows_out:
            self._emit(
                f'{{"ph":"s","id":{fid},"cat":"flow",'
                f'"name":"{FLOW_NAMES[flow_kind(fid)]}",{where}}}'
            )
        for fid in flows_in:
            self._emit(
                f'{{"ph":"f","bp":"e","id":{fid},"cat":"flow",'
                f'"name":"{FLOW_NAMES[flow_kind(fid)]}",{where}}}'
            )

    def counter(self, track: Track, ts: int, value: float) -> None:
        series = self._q(track.unit or "value")
        self._emit(
            f'{{"ph":"C","name":{self._q(track.name)},"pid":{track.pid},'
            f'"ts":{us_text(ts - self._base)},"args":{{{series}:{_number(value)}}}}}'
        )

    def instant(self, track: Track, ts: int, name: str, cat: str, args: Args | None = None) -> None:
        self._emit(
            f'{{"ph":"i","s":"t","cat":{self._q(cat)},"name":{self._q(name)},'
            f'"pid":{track.pid},"tid":{track.tid},"ts":{us_text(ts - self._base)},'
            f'"args":{_args_text(args, None)}}}'
        )

    def close(self) -> None:
        self._flush()
        self._file.write("\n]}\n")

    # -- text ----------------------------------------------------------------------------

    def _meta(self, kind: str, pid: int, tid: int, key: str, value) -> None:
        self._emit(
            f'{{"ph":"M","name":"{kind}","pid":{pid},"tid":{tid},'
            f'"args":{{"{key}":{_dumps(value)}}}}}'
        )

    def _q(self, text: str) -> str:
        q = self._quoted.get(text)
        if q is None:
            q = self._quoted[text] = _dumps(text)
        return q

    def _emit(self, event: str) -> None:
        self._buf.append(event)
        self.events += 1
        if len(self._buf) >= self._chunk:
            self._flush()

    def _flush(self) -> None:
        if self._buf:
            text = ",\n".join(self._buf)
            self._file.write(text if self._first else ",\n" + text)
            self._first = False
            self._buf.clear()


def _number(value: float) -> str:
    if value != value or value in (float("inf"), float("-inf")):
        return "null"  # JSON has no NaN
    return repr(int(value)) if float(value).is_integer() else repr(float(value))


def _args_text(args: Args | None, raw: str | None) -> str:
    ours = []
    for key, value in args or ():
        if raw and f'"{key}"' in raw:
            continue  # the recorded args already say it (e.g. Kineto's correlation)
        text = _number(value) if isinstance(value, float) else _dumps(value)
        ours.append(f"{_dumps(key)}:{text}")
    raw = raw.strip() if raw else ""
    if raw.startswith("{") and raw.endswith("}"):  # the schema's promise: a JSON object
        if raw[1:-1].strip():
            ours.append(raw[1:-1].strip())
    elif raw:  # anything else is kept as text rather than risk invalid JSON
        ours.append(f'"args":{_dumps(raw)}')
    return "{" + ",".join(ours) + "}"
