"""Perfetto sink: native TracePacket protobuf, written in chunks as the layout produces it.

- Streaming: packets go into a `TraceProtoBuilder` (the `perfetto` package's builder) and
  every `chunk_packets` packets its `Trace` is serialised, appended to the file and
  dropped. Concatenated `Trace` messages are one valid `Trace` (a repeated field), so
  memory holds one chunk, the open slices and the intern tables, whatever the run's size.
- Interning: event names, categories and argument names are sent once per sequence as
  `InternedData` in the packet that first uses them; the first packet clears the
  sequence's incremental state and every event packet says it needs it.
- Timestamps: TrackEvent ns, the run's own clock, unchanged (what the tables hold, so a
  test can compare exactly). A ClockSnapshot pairs that clock (as the trace's default
  clock, BOOTTIME) with REALTIME, so the UI can also show wall time.
- Slices are begin/end pairs. The layout hands each track's slices sorted and nested;
  the end of a slice is written when the next slice on its track starts after it, or at
  the end, innermost first, so a track's events are always in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import BinaryIO

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from perfetto.trace_builder.proto_builder import TraceProtoBuilder

from .sink import Args, TraceInfo
from .tracks import COUNTER, GROUP, Track

SEQUENCE_ID = 1
CHUNK_PACKETS = 8192
_BEGIN, _END = pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_SLICE_END
_INSTANT, _COUNTER = pb.TrackEvent.TYPE_INSTANT, pb.TrackEvent.TYPE_COUNTER
_NEEDS_STATE = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
_CLEARED = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
_EXPLICIT = pb.TrackDescriptor.ChildTracksOrdering.Value("EXPLICIT")
_NO_MERGE = pb.TrackDescriptor.SiblingMergeBehavior.Value("SIBLING_MERGE_BEHAVIOR_NONE")


class PerfettoSink:
    def __init__(self, file: BinaryIO, chunk_packets: int = CHUNK_PACKETS):
        self._file = file
        self._chunk = chunk_packets
        self._builder = TraceProtoBuilder()
        self._pending = 0
        self._names: dict[str, int] = {}
        self._cats: dict[str, int] = {}
        self._arg_names: dict[str, int] = {}
        self._open: dict[int, list[int]] = {}  # track uuid -> ends of its open slices
        self._last_start: dict[int, int] = {}
        self._last_sample: dict[int, int] = {}
        self.packets = 0
        self.bytes_written = 0

    # -- the Sink protocol -------------------------------------------------------------

    def begin(self, info: TraceInfo) -> None:
        p = self._packet()
        p.sequence_flags = _CLEARED
        p.first_packet_on_sequence = True
        if info.first_ns is not None and info.wall_at(info.first_ns) is not None:
            snap = p.clock_snapshot
            snap.clocks.add(clock_id=pb.BUILTIN_CLOCK_BOOTTIME, timestamp=info.first_ns)
            snap.clocks.add(
                clock_id=pb.BUILTIN_CLOCK_REALTIME, timestamp=info.wall_at(info.first_ns)
            )
            snap.primary_trace_clock = pb.BUILTIN_CLOCK_BOOTTIME
            p.timestamp = info.first_ns

    def declare(self, track: Track) -> None:
        p = self._packet()
        d = p.track_descriptor
        d.uuid = track.uuid
        if track.parent is not None:
            d.parent_uuid = track.parent
        if track.kind == GROUP:
            d.child_ordering = _EXPLICIT
        d.sibling_order_rank = track.order
        d.sibling_merge_behavior = _NO_MERGE  # our lanes are distinct on purpose
        if track.os_process:
            d.process.pid = track.pid
            d.process.process_name = track.name
        elif track.os_thread:
            d.thread.pid = track.pid
            d.thread.tid = track.tid
            d.thread.thread_name = track.name
        else:
            d.name = track.name
        if track.kind == COUNTER:
            d.counter.unit_name = track.unit
            self._last_sample[track.uuid] = -(1 << 63)
        else:
            self._open[track.uuid] = []
            self._last_start[track.uuid] = -(1 << 63)

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
        uuid = track.uuid
        stack = self._open[uuid]
        end = start + dur
        if start < self._last_start[uuid]:
            raise ValueError(f"slices on track {track.name!r} out of order at {start}")
        self._last_start[uuid] = start
        while stack and stack[-1] <= start:
            self._end(uuid, stack.pop())
        if stack and end > stack[-1]:
            raise ValueError(f"slice {name!r} at {start} overlaps its parent on {track.name!r}")
        stack.append(end)
        p = self._packet()
        p.timestamp = start
        p.sequence_flags = _NEEDS_STATE
        te = p.track_event
        te.type = _BEGIN
        te.track_uuid = uuid
        iid = self._names.get(name)  # the hot path: a name seen before
        te.name_iid = iid if iid else self._intern(p, "event_names", self._names, name)
        iid = self._cats.get(cat)
        te.category_iids.append(
            iid if iid else self._intern(p, "event_categories", self._cats, cat)
        )
        if args:
            self._annotate(p, te, args)
        if raw_args:
            te.debug_annotations.add(
                name_iid=self._intern(p, "debug_annotation_names", self._arg_names, "args"),
                legacy_json_value=raw_args,
            )
        if flows_out:
            te.flow_ids.extend(flows_out)
        if flows_in:
            te.terminating_flow_ids.extend(flows_in)

    def counter(self, track: Track, ts: int, value: float) -> None:
        if ts < self._last_sample[track.uuid]:
            raise ValueError(f"counter {track.name!r} out of order at {ts}")
        self._last_sample[track.uuid] = ts
        p = self._packet()
        p.timestamp = ts
        te = p.track_event
        te.type = _COUNTER
        te.track_uuid = track.uuid
        te.double_counter_value = value

    def instant(self, track: Track, ts: int, name: str, cat: str, args: Args | None = None) -> None:
        p = self._packet()
        p.timestamp = ts
        p.sequence_flags = _NEEDS_STATE
        te = p.track_event
        te.type = _INSTANT
        te.track_uuid = track.uuid
        te.name_iid = self._intern(p, "event_names", self._names, name)
        te.category_iids.append(self._intern(p, "event_categories", self._cats, cat))
        if args:
            self._annotate(p, te, args)

    def close(self) -> None:
        for uuid, stack in self._open.items():
            while stack:
                self._end(uuid, stack.pop())
        self._flush()

    # -- encoding ----------------------------------------------------------------------

    def _packet(self) -> pb.TracePacket:
        if self._pending >= self._chunk:
            self._flush()
        self._pending += 1
        self.packets += 1
        p = self._builder.add_packet()
        p.trusted_packet_sequence_id = SEQUENCE_ID
        return p

    def _flush(self) -> None:
        if self._pending:
            data = self._builder.serialize()
            self._file.write(data)
            self.bytes_written += len(data)
            self._builder = TraceProtoBuilder()
            self._pending = 0

    def _end(self, uuid: int, ts: int) -> None:
        p = self._packet()
        p.timestamp = ts
        te = p.track_event
        te.type = _END
        te.track_uuid = uuid

    def _intern(self, p: pb.TracePacket, table: str, ids: dict[str, int], text: str) -> int:
        iid = ids.get(text)
        if iid is None:
            iid = ids[text] = len(ids) + 1
            getattr(p.interned_data, table).add(iid=iid, name=text)
        return iid

    def _annotate(self, p: pb.TracePacket, te: pb.TrackEvent, args: Args) -> None:
        add, ids = te.debug_annotations.add, self._arg_names
        for key, value in args:
            iid = ids.get(key) or self._intern(p, "debug_annotation_names", ids, key)
            if type(value) is int:  # most arguments: ids, counts, bytes
                add(name_iid=iid, int_value=value)
                continue
            a = add(name_iid=iid)
            if isinstance(value, bool):
                a.bool_value = value
            elif isinstance(value, int):
                a.int_value = value
            elif isinstance(value, float):
                a.double_value = value
            else:
                a.string_value = str(value)
