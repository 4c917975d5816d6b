"""The track tree shared by every export format.

Two levels, because that is what every viewer understands: groups (a Chrome "process",
a Perfetto top-level track or process) and the tracks inside them (a Chrome "thread", a
Perfetto child or thread track; a counter). Each track gets a Perfetto uuid and a Chrome
(pid, tid). Real OS processes and threads keep their ids; everything else (requests,
the scheduler, GPU streams, extra lanes, a pid seen on two ranks) gets a synthetic id
from 2^30 up, far above any kernel's pid_max, so the two never collide.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

SYNTHETIC_ID_BASE = 1 << 30

GROUP, SLICES, COUNTER, INSTANTS = "group", "slices", "counter", "instants"


@dataclass(frozen=True)
class Track:
    uuid: int
    name: str
    kind: str  # group | slices | counter | instants
    parent: int | None  # the group's uuid; None for a group
    order: int  # position among its siblings (declaration order)
    pid: int  # Chrome process id (the group's)
    tid: int  # Chrome thread id (0 for groups and counters)
    os_process: bool = False  # a group standing for a real process (pid is real)
    os_thread: bool = False  # a track standing for a real thread (pid, tid are real)
    unit: str = ""  # counters: the unit's name


class TrackTree:
    """Allocates tracks and hands each new one to `declare` (a sink's) as it is made, so
    a track is always declared before anything is put on it."""

    def __init__(self, declare: Callable[[Track], None]) -> None:
        self._declare = declare
        self._by_uuid: dict[int, Track] = {}
        self._uuid = 0
        self._synthetic = SYNTHETIC_ID_BASE
        self._pids: set[int] = set()
        self._tids: set[tuple[int, int]] = set()
        self._children: dict[int, int] = {}
        self._groups = 0
        self._by_key: dict[object, Track] = {}

    def get(self, key: object) -> Track | None:
        return self._by_key.get(key)

    def group(self, key: object, name: str, *, os_pid: int | None = None) -> Track:
        """A top-level group; `os_pid` keeps a real process id when no other group has it."""
        if key in self._by_key:
            return self._by_key[key]
        real = os_pid is not None and 0 <= os_pid < SYNTHETIC_ID_BASE and os_pid not in self._pids
        pid = os_pid if real else self._next_id()
        self._pids.add(pid)
        track = Track(self._next_uuid(), name, GROUP, None, self._groups, pid, 0, os_process=real)
        self._groups += 1
        self._children[track.uuid] = 0
        return self._add(key, track)

    def child(
        self,
        key: object,
        group: Track,
        name: str,
        kind: str = SLICES,
        *,
        os_tid: int | None = None,
        unit: str = "",
    ) -> Track:
        """A track inside `group`; `os_tid` keeps a real thread id (only in a real process)."""
        if key in self._by_key:
            return self._by_key[key]
        real = (
            group.os_process
            and os_tid is not None
            and 0 <= os_tid < SYNTHETIC_ID_BASE
            and (group.pid, os_tid) not in self._tids
        )
        tid = os_tid if real else (0 if kind == COUNTER else self._next_id())
        self._tids.add((group.pid, tid))
        order = self._children[group.uuid]
        self._children[group.uuid] = order + 1
        track = Track(
            self._next_uuid(),
            name,
            kind,
            group.uuid,
            order,
            group.pid,
            tid,
            os_thread=bool(real),
            unit=unit,
        )
        return self._add(key, track)

    def parent(self, track: Track) -> Track:
        return self._by_uuid[track.parent]

    def _add(self, key: object, track: Track) -> Track:
        self._by_key[key] = track
        self._by_uuid[track.uuid] = track
        self._declare(track)
        return track

    def _next_uuid(self) -> int:
        self._uuid += 1
        return self._uuid

    def _next_id(self) -> int:
        self._synthetic += 1
        return self._synthetic
