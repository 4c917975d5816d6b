"""Who recorded each trace file, read before any row is written: its rank, world size,
device and start, from the top-level keys wherever they stand in the document.

Kineto writes `distributedInfo` and `deviceProperties` before `traceEvents` and
`baseTimeNanoseconds` after it, but other writers (perfdiag's exports before they wrote
their header first, hand-edited files) put them anywhere. The keys before the events
cost one event's decoding; keys after them are read from the file's tail (the last `TAIL_CHARS`
characters: a plain file seeks there, a gzip is decompressed to its end, without
decoding), and only when something is missing before the events. A single gzipped
file is not decompressed an extra time for it: the import reads the complete header as
it goes, and reads the file again only if the tail changed its identity (a trailing
`distributedInfo`, a perfdiag export: `late_identity`) — rare, since Kineto writes
`distributedInfo` first and perfdiag's exports write their header first.

`assign_ranks` then gives every file of a multi-file import its rank (an explicit
`--rank` first, then `distributedInfo`, then the first free rank by position), refuses
two files of one rank, and says in warnings where the files disagree (world size,
device, start days apart) — signs that they are not the ranks of one job.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from ...errors import ConfigError
from .chrome_stream import ChromeTraceStream, TraceFormatError
from .compressed import DATA_ERRORS, is_gzip, open_trace
from .kineto_parallel import is_object_document

TAIL_CHARS = 1 << 20  # the keys after the events: distributedInfo of 300 ranks is ~20 KB
FIRST_EVENTS = 256  # events looked at for the file's start
APART_NS = 3600 * 10**9  # ranks of one job start within seconds; an hour apart is not one
_ARRAY_END = re.compile(r"\][ \t\n\r]*,[ \t\n\r]*\"")


@dataclass
class TraceIdentity:
    path: Path
    rank: int | None  # as the file says (distributedInfo), before any override
    world_size: int | None
    backend: str | None
    device: str | None  # the first GPU's name
    base_time_ns: int | None  # baseTimeNanoseconds (None: absent, ts are Unix µs)
    start_ns: int | None  # the first events' time, Unix ns (approximate: for warnings)
    header: dict = field(default_factory=dict)  # every top-level key but traceEvents found
    rank_source: str = "none"  # distributedInfo | --rank | position | none
    first_ts: object = None  # the first events' smallest ts, as written
    tail_read: bool = True  # False: keys after the events not looked at yet


def _int(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def tail_members(path: Path) -> dict:
    """The top-level keys written after `traceEvents`, from the file's tail ({} when
    there are none or they do not fit in the tail)."""
    gz = is_gzip(path)
    tail = ""
    try:
        if gz:
            with open_trace(path, gz=True, encoding="utf-8", errors="replace") as f:
                while chunk := f.read(1 << 22):
                    tail = (tail + chunk)[-TAIL_CHARS:]
        else:
            with open(path, "rb") as f:
                f.seek(max(0, os.path.getsize(path) - TAIL_CHARS))
                tail = f.read().decode("utf-8", errors="replace")
    except DATA_ERRORS as e:
        raise TraceFormatError(f"{path}: compressed data is corrupt or truncated ({e})") from None
    # The array's end is the first `], "` from which the rest parses as an object's
    # members to the document's end: one inside an event fails at that event's end.
    for m in _ARRAY_END.finditer(tail):
        members = _members(tail, m.end() - 1)
        if members is not None:
            return members
    return {}


_DECODER = json.JSONDecoder(parse_float=str)
_WS = re.compile(r"[ \t\n\r]*")


def _members(text: str, pos: int) -> dict | None:
    """`"key": value, …}` from `pos` to the end of `text` (nothing after but
    whitespace), as a dict; None when the text there is anything else."""
    scan, ws, out = _DECODER.scan_once, _WS.match, {}
    try:
        while True:
            key, pos = scan(text, pos)
            pos = ws(text, pos).end()
            if not isinstance(key, str) or text[pos : pos + 1] != ":":
                return None
            value, pos = scan(text, ws(text, pos + 1).end())
            out[key] = value
            pos = ws(text, pos).end()
            c = text[pos : pos + 1]
            if c == "}":
                return out if ws(text, pos + 1).end() == len(text) else None
            if c != ",":
                return None
            pos = ws(text, pos + 1).end()
    except (StopIteration, ValueError, RecursionError):
        return None


def _first_start_us(events) -> object | None:
    """The smallest `ts` among the first complete events (µs, as written)."""
    best = None
    for i, ev in enumerate(events):
        if i >= FIRST_EVENTS:
            break
        if ev.get("ph") == "X":
            ts = ev.get("ts")
            try:
                value = float(ts)
            except (TypeError, ValueError):
                continue
            if value == value and (best is None or value < best[0]):
                best = (value, ts)
    return None if best is None else best[1]


def read_identity(path: Path, *, need_base: bool = False) -> TraceIdentity:
    """The file's identity from the keys before its events, and from its tail when one
    it needs is missing there. `need_base`: also find `baseTimeNanoseconds` (several
    files go onto one time base). A gzip that needs no base is not decompressed twice:
    its tail is left for the import to find (`tail_read` False; see `late_identity`)."""
    stream = ChromeTraceStream(path)
    events = stream.events()
    try:
        first_ts = _first_start_us(events)
    finally:
        events.close()
    header = dict(stream.header)
    wanted = ("distributedInfo", "baseTimeNanoseconds") if need_base else ("distributedInfo",)
    tail_read = True
    if any(k not in header for k in wanted) and is_object_document(path):
        if need_base or not is_gzip(path):
            for key, value in tail_members(path).items():
                header.setdefault(key, value)
        else:
            tail_read = False
    ident = identity_from_header(path, header, first_ts)
    ident.tail_read = tail_read
    return ident


def identity_from_header(path: Path, header: dict, first_ts=None) -> TraceIdentity:
    """The identity the top-level keys `header` give (`first_ts`: the first events'
    smallest ts as written, for the start)."""
    from .kineto_events import to_ns

    info = header.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    props = header.get("deviceProperties")
    device = None
    if isinstance(props, list) and props and isinstance(props[0], dict):
        name = props[0].get("name")
        device = None if name is None else str(name)
    base = _int(header.get("baseTimeNanoseconds"))
    start = None
    if first_ts is not None:
        try:
            start = (base or 0) + to_ns(first_ts)
        except (TypeError, ValueError, ArithmeticError):
            start = None
    rank = _int(info.get("rank"))
    backend = info.get("backend")
    return TraceIdentity(
        path=path,
        rank=rank if rank is not None and rank >= 0 else None,
        world_size=_int(info.get("world_size")),
        backend=None if backend is None else str(backend),
        device=device,
        base_time_ns=base if base is not None and base >= 0 else None,
        start_ns=start,
        header=dict(header),
        rank_source="distributedInfo" if rank is not None and rank >= 0 else "none",
        first_ts=first_ts,
    )


def is_perfdiag_export(header: dict) -> bool:
    """perfdiag's Chrome and TensorBoard exports say so in `otherData`."""
    other = header.get("otherData")
    return isinstance(other, dict) and "perfdiag_version" in other and "run_id" in other


def late_identity(ident: TraceIdentity, header: dict) -> TraceIdentity | None:
    """After a file was read whose tail was not (`tail_read` False): the identity its
    complete header gives, if that changes how the file is read — a rank found after
    the events, or a perfdiag export — else None (then the import stands)."""
    if ident.tail_read:
        return None
    full = identity_from_header(ident.path, {**header, **ident.header}, ident.first_ts)
    rank_late = ident.rank_source == "none" and full.rank is not None
    export_late = is_perfdiag_export(full.header) and not is_perfdiag_export(ident.header)
    if not (rank_late or export_late):
        return None
    if ident.rank_source != "none":  # --rank (or position) still decides
        full.rank, full.rank_source = ident.rank, ident.rank_source
    return full


def assign_ranks(ids: list[TraceIdentity], ranks: list[int] | None = None) -> list[str]:
    """Give each file its rank (in place); returns warnings. Raises ConfigError on two
    files of one rank or a `ranks` list that does not fit the files."""
    warnings: list[str] = []
    if ranks is not None:
        if len(ranks) != len(ids):
            raise ConfigError(
                f"--rank given {len(ranks)} time(s) for {len(ids)} trace file(s): "
                "give one --rank per file, in the files' order"
            )
        for ident, r in zip(ids, ranks, strict=True):
            if r < 0:
                raise ConfigError(f"--rank {r}: a rank is a non-negative integer")
            if ident.rank is not None and ident.rank != r:
                warnings.append(
                    f"{ident.path.name}: distributedInfo says rank {ident.rank}; "
                    f"--rank {r} is used instead"
                )
            ident.rank, ident.rank_source = r, "--rank"
    if len(ids) > 1:
        taken = {i.rank for i in ids if i.rank is not None}
        free = (r for r in range(len(ids) + len(taken)) if r not in taken)
        for ident in ids:
            if ident.rank is None:
                ident.rank, ident.rank_source = next(free), "position"
                warnings.append(
                    f"{ident.path.name}: no rank in the file (distributedInfo); taken as "
                    f"rank {ident.rank} by its place in the list (--rank to say otherwise)"
                )
    by_rank: dict[int, list[TraceIdentity]] = {}
    for ident in ids:
        if ident.rank is not None:
            by_rank.setdefault(ident.rank, []).append(ident)
    for rank, group in by_rank.items():
        if len(group) > 1:
            names = " and ".join(str(i.path) for i in group[:3]) + (" …" if len(group) > 3 else "")
            source = group[0].rank_source
            both = "both" if len(group) == 2 else f"all {len(group)}"
            raise ConfigError(
                f"{names} are {both} rank {rank} ({source}): files of one rank are not the "
                "ranks of one job; import them separately, or give each its rank with --rank"
            )
    if len(ids) > 1:
        warnings += disagreements(ids)
    return warnings


def _listing(ids: list[TraceIdentity], attr: str) -> str:
    return ", ".join(f"{i.path.name} {getattr(i, attr)}" for i in ids)


def disagreements(ids: list[TraceIdentity]) -> list[str]:
    """Warnings where files claimed as one job's ranks disagree."""
    out = []
    worlds = [i for i in ids if i.world_size is not None]
    if len({i.world_size for i in worlds}) > 1:
        out.append(f"the traces disagree on the world size ({_listing(worlds, 'world_size')})")
    for i in worlds:
        if i.rank is not None and i.rank >= i.world_size:
            out.append(f"{i.path.name}: rank {i.rank} is not below its world size {i.world_size}")
    devices = [i for i in ids if i.device is not None]
    if len({i.device for i in devices}) > 1:
        out.append(f"the traces disagree on the device ({_listing(devices, 'device')})")
    starts = [i for i in ids if i.start_ns is not None]
    if len(starts) > 1:
        lo = min(starts, key=lambda i: i.start_ns)
        hi = max(starts, key=lambda i: i.start_ns)
        if hi.start_ns - lo.start_ns > APART_NS:
            out.append(
                f"the traces start {_apart(hi.start_ns - lo.start_ns)} apart ({lo.path.name} "
                f"at {_when(lo.start_ns)}, {hi.path.name} at {_when(hi.start_ns)}): ranks of "
                "one job start within seconds of each other"
            )
    return out


def _apart(ns: int) -> str:
    hours = ns / 3.6e12
    return f"{hours / 24:,.1f} days" if hours >= 48 else f"{hours:,.1f} hours"


def _when(ns: int) -> str:
    try:
        return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M UTC")
    except (OverflowError, OSError, ValueError):
        return f"{ns} ns"
