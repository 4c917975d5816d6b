"""Lanes: spread intervals over sub-tracks so that slices on one track always nest.

Perfetto and the Chrome viewers draw a track as a stack of slices; two slices that
partially overlap on one track break it (Perfetto closes the wrong slice, Chrome warns
and misdraws). Real traces do overlap: profiler ops on one thread a few ns apart,
annotations across op boundaries, concurrent requests. Each interval goes to the first
lane where it nests (inside the innermost open slice there, or after it ends), so the
common case, a well-formed thread or stream, stays on one lane.
"""

from __future__ import annotations

import heapq

import numpy as np


class NestingLanes:
    """Online first-fit over lanes; feed intervals sorted by (start, -end).

    An interval ending exactly where the next starts counts as ended (siblings), which
    is also how the sinks close slices: end <= next start.
    """

    __slots__ = ("stacks",)

    def __init__(self) -> None:
        self.stacks: list[list[int]] = []  # per lane: ends of the open slices, innermost last

    @property
    def count(self) -> int:
        return len(self.stacks)

    def assign(self, starts: list[int], ends: list[int]) -> list[int]:
        stacks = self.stacks
        if len(stacks) <= 1 and _disjoint(starts, ends, stacks):
            # the usual GPU stream: back to back, nothing open across the chunk
            if not stacks:
                stacks.append([])
            if ends:
                stacks[0][:] = [ends[-1]]
            return [0] * len(starts)
        out = []
        for s, e in zip(starts, ends, strict=True):
            for lane, stack in enumerate(stacks):
                while stack and stack[-1] <= s:
                    stack.pop()
                if not stack or e <= stack[-1]:
                    stack.append(e)
                    out.append(lane)
                    break
            else:
                stacks.append([e])
                out.append(len(stacks) - 1)
        return out


def _disjoint(starts: list[int], ends: list[int], stacks: list[list[int]]) -> bool:
    if not starts:
        return True
    if stacks and stacks[0] and stacks[0][0] > starts[0]:
        return False  # something from the previous chunk is still open
    if len(starts) == 1:
        return True
    s, e = np.asarray(starts), np.asarray(ends)
    return bool((s[1:] >= e[:-1]).all())


def interval_lanes(starts: list[int], ends: list[int]) -> list[int]:
    """Lanes for top-level intervals sorted by start: the lowest free lane, so a lane is
    reused as soon as its last interval ended (at most as many lanes as were ever busy
    at once)."""
    free: list[int] = []
    busy: list[tuple[int, int]] = []  # (end, lane)
    out, fresh = [], 0
    for s, e in zip(starts, ends, strict=True):
        while busy and busy[0][0] <= s:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            lane, fresh = fresh, fresh + 1
        heapq.heappush(busy, (e, lane))
        out.append(lane)
    return out
