"""A structural validator for Perfetto traces, modelled on how Perfetto's trace processor
reads them (a test utility; tests load it through the `perfetto_trace` fixture).

It decodes the file with the protobuf classes the `perfetto` package ships and checks:
- every packet names its sequence; interned ids are defined (in an earlier or the same
  packet, after the sequence's incremental state was cleared) before they are used, and
  packets that use them say they need that state;
- every track is declared once, its parent before it, and before any event uses it; one
  thread descriptor per (pid, tid); counters only on counter tracks, slices elsewhere;
- events are then ordered as the trace processor orders them (by timestamp; ties in file
  order): slice ends always close an open slice, every slice is closed by the end;
- every flow has an origin and a terminus, each id used once for each, origin first;
- counter samples of a track are in time order in the file.
It returns what it decoded (tracks, slices with depth and args, counters, instants,
flows) for the tests to compare with the run. Begin/end pairs cannot express a partial
overlap (an end closes the innermost open slice), so two intervals that overlapped on one
track come back with the wrong ends: the tests catch that by comparing every slice's
start and duration with the run's.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

BEGIN, END = pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_SLICE_END
INSTANT, COUNTER = pb.TrackEvent.TYPE_INSTANT, pb.TrackEvent.TYPE_COUNTER
CLEARED = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
NEEDS = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
TABLES = {"event_names": "name", "event_categories": "cat", "debug_annotation_names": "arg"}


class InvalidTrace(AssertionError):
    pass


@dataclass
class TrackInfo:
    uuid: int
    name: str
    parent: int | None
    counter: bool
    pid: int | None = None
    tid: int | None = None
    order: int = 0


@dataclass
class Slice:
    track: int
    name: str
    category: str
    start: int
    end: int = -1
    depth: int = 0
    args: dict = field(default_factory=dict)

    @property
    def dur(self) -> int:
        return self.end - self.start


@dataclass
class Decoded:
    tracks: dict[int, TrackInfo]
    slices: list[Slice]
    counters: dict[int, list[tuple[int, float]]]
    instants: list[Slice]
    flows: list[tuple[Slice, Slice]]
    clock_snapshots: list[dict[int, int]]
    packets: int

    def by_category(self) -> Counter:
        return Counter(s.category for s in self.slices)

    def track_named(self, name: str) -> list[TrackInfo]:
        return [t for t in self.tracks.values() if t.name == name]

    def path(self, uuid: int) -> str:
        t = self.tracks[uuid]
        return t.name if t.parent is None else f"{self.path(t.parent)}/{t.name}"


def validate(trace: bytes | str | Path) -> Decoded:
    data = trace if isinstance(trace, bytes) else Path(trace).read_bytes()
    packets = pb.Trace.FromString(data).packet
    errors: list[str] = []
    tracks: dict[int, TrackInfo] = {}
    threads: set[tuple[int, int]] = set()
    interned: dict[int, dict[str, dict[int, str]]] = {}
    events = []  # (ts, file index, packet's event fields…)
    counters: dict[int, list[tuple[int, float]]] = defaultdict(list)
    snapshots = []
    for i, p in enumerate(packets):
        seq = p.trusted_packet_sequence_id
        if not seq:
            errors.append(f"packet {i}: no trusted_packet_sequence_id")
        if p.sequence_flags & CLEARED:
            interned[seq] = {t: {} for t in TABLES}
        if p.HasField("interned_data"):
            if seq not in interned:
                errors.append(f"packet {i}: interned data before the state was cleared")
                interned[seq] = {t: {} for t in TABLES}
            for table in TABLES:
                for entry in getattr(p.interned_data, table):
                    known = interned[seq][table].get(entry.iid)
                    if known is not None and known != entry.name:
                        errors.append(f"packet {i}: {table} iid {entry.iid} redefined")
                    interned[seq][table][entry.iid] = entry.name
        if p.HasField("clock_snapshot"):
            snapshots.append({c.clock_id: c.timestamp for c in p.clock_snapshot.clocks})
        if p.HasField("track_descriptor"):
            _declare(p.track_descriptor, i, tracks, threads, errors)
        if p.HasField("track_event"):
            ev = _event(p, i, seq, interned, tracks, errors)
            if ev is not None:
                events.append(ev)
                if ev[2] == COUNTER:
                    counters[ev[3]].append((ev[0], ev[8]))
    for uuid, samples in counters.items():
        if any(b[0] < a[0] for a, b in pairwise(samples)):
            errors.append(f"counter track {tracks[uuid].name!r}: samples out of time order")
    slices, instants, flows = _replay(events, tracks, errors)
    if errors:
        raise InvalidTrace(f"{len(errors)} problem(s): " + "; ".join(errors[:10]))
    return Decoded(tracks, slices, dict(counters), instants, flows, snapshots, len(packets))


def _declare(d, i: int, tracks, threads, errors) -> None:
    if d.uuid in tracks:
        errors.append(f"packet {i}: track {d.uuid} declared twice")
    if d.HasField("parent_uuid") and d.parent_uuid not in tracks:
        errors.append(f"packet {i}: track {d.uuid}'s parent {d.parent_uuid} is not declared")
    info = TrackInfo(d.uuid, d.name, d.parent_uuid if d.HasField("parent_uuid") else None,
                     d.HasField("counter"), order=d.sibling_order_rank)  # fmt: skip
    if d.HasField("process"):
        info.name, info.pid = d.process.process_name, d.process.pid
    if d.HasField("thread"):
        info.name, info.pid, info.tid = d.thread.thread_name, d.thread.pid, d.thread.tid
        if (info.pid, info.tid) in threads:
            errors.append(f"packet {i}: thread {info.pid}/{info.tid} declared twice")
        threads.add((info.pid, info.tid))
    if not info.name:
        errors.append(f"packet {i}: track {d.uuid} has no name")
    tracks[d.uuid] = info


def _event(p, i: int, seq: int, interned, tracks, errors):
    te = p.track_event
    if te.track_uuid not in tracks:
        errors.append(f"packet {i}: event on undeclared track {te.track_uuid}")
        return None
    counter_track = tracks[te.track_uuid].counter
    if (te.type == COUNTER) != counter_track:
        errors.append(f"packet {i}: event type {te.type} on track {tracks[te.track_uuid].name!r}")
    uses = (
        te.HasField("name_iid")
        or len(te.category_iids)
        or any(a.HasField("name_iid") for a in te.debug_annotations)
    )
    if uses and not p.sequence_flags & NEEDS:
        errors.append(f"packet {i}: uses interned data without SEQ_NEEDS_INCREMENTAL_STATE")
    state = interned.get(seq, {t: {} for t in TABLES})

    def lookup(table: str, iid: int) -> str:
        name = state[table].get(iid)
        if name is None:
            errors.append(f"packet {i}: {table} iid {iid} is not defined")
        return name or "?"

    name = lookup("event_names", te.name_iid) if te.HasField("name_iid") else te.name
    cats = [lookup("event_categories", c) for c in te.category_iids] or list(te.categories)
    args = {}
    for a in te.debug_annotations:
        key = lookup("debug_annotation_names", a.name_iid) if a.HasField("name_iid") else a.name
        which = a.WhichOneof("value")
        args[key] = getattr(a, which) if which else None
    if te.type in (BEGIN, INSTANT) and not name:
        errors.append(f"packet {i}: a slice without a name")
    value = te.double_counter_value if te.HasField("double_counter_value") else te.counter_value
    return (p.timestamp, i, te.type, te.track_uuid, name, cats[0] if cats else "", args,
            (list(te.flow_ids), list(te.terminating_flow_ids)), value)  # fmt: skip


def _replay(events, tracks, errors):
    stacks: dict[int, list[Slice]] = defaultdict(list)
    slices, instants, flows = [], [], []
    active: dict[int, Slice] = {}
    used_out, used_in = Counter(), Counter()
    for ts, i, kind, track, name, cat, args, (outs, ins), _ in sorted(events, key=lambda e: e[:2]):
        if kind == BEGIN:
            s = Slice(track, name, cat, ts, depth=len(stacks[track]), args=args)
            stacks[track].append(s)
            slices.append(s)
            for fid in outs:
                used_out[fid] += 1
                if fid in active:
                    flows.append((active[fid], s))
                active[fid] = s
            for fid in ins:
                used_in[fid] += 1
                origin = active.pop(fid, None)
                if origin is None:
                    errors.append(f"packet {i}: flow {fid} ends before it starts (or twice)")
                else:
                    flows.append((origin, s))
        elif kind == END:
            if not stacks[track]:
                errors.append(f"packet {i}: end on {tracks[track].name!r} with no open slice")
            else:
                stacks[track].pop().end = ts
        elif kind == INSTANT:
            instants.append(Slice(track, name, cat, ts, ts, args=args))
    for track, stack in stacks.items():
        if stack:
            errors.append(f"{len(stack)} slice(s) left open on {tracks[track].name!r}")
    if active:
        errors.append(f"{len(active)} flow(s) without a terminus, e.g. {next(iter(active))}")
    twice = [f for f, n in (used_out + used_in).items() if n != 2 or used_out[f] != 1]
    if twice:
        errors.append(f"{len(twice)} flow id(s) not used exactly once per end, e.g. {twice[0]}")
    return slices, instants, flows
