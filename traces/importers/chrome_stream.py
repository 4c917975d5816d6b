"""Stream a Chrome-trace JSON document (plain or gzipped) one event object at a time.

A profiler trace can be gigabytes, so the file is never loaded whole: text is read in
chunks into a sliding buffer and the C JSON scanner decodes one element of the
`traceEvents` array at a time (measured at ~0.5 M events/s on one core, the fastest
pure-stdlib option). Every other top-level key (device properties, rank, base time…)
is small and decoded into `header`, wherever it sits in the document: Kineto writes
some keys after `traceEvents`, so the header is complete only once `events()` ends.

Floats are kept as their text (`parse_float=str`): timestamps are microseconds with
nanosecond fractions around 1.7e15, where a float64 keeps only quarter-microsecond
steps, so the importer converts the digits exactly (see kineto_events.to_ns).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path

from ...errors import ConfigError
from .compressed import DATA_ERRORS, GZIP_MAGIC, open_trace

CHUNK_CHARS = 1 << 20  # 1 Mi characters per read: as fast as 4 Mi, 30 MB less at peak
BATCH_CHARS = 1 << 20  # a batch read's text per decode (~5k Kineto events)
MAX_CUTS = 64  # cuts tried per batch before a batch read gives up
_WS = re.compile(r"[ \t\n\r]*")
_BOUNDARY = re.compile(r"\}[ \t\n\r]*,[ \t\n\r]*(\{)")
_END = re.compile(r"\}[ \t\n\r]*\]")
_NEXT = re.compile(r"[ \t\n\r]*([,\]])[ \t\n\r]*")
_TOKEN = re.compile(r'\\.?|"|[\[\]{}]')  # escapes, quotes and brackets, for skipping


class BatchDecodeFailed(Exception):
    """A batch read (`events(decode_batch=...)`) met text its decoder refuses."""


class StopCutFailed(BatchDecodeFailed):
    """A batch read's stop (`stop_at`) fell where no cut decodes (a `},{` in a string)."""


class TraceFormatError(ConfigError):
    """The trace file is not valid Chrome-trace JSON (malformed, truncated, unreadable)."""


class ChromeTraceStream:
    """`events()` yields each element of `traceEvents` as a dict; `header` holds the rest."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.header: dict = {}
        self.events_seen = 0
        self.too_deep = 0  # events skipped: nested deeper than the JSON decoder recurses
        self._decoder = json.JSONDecoder(parse_float=str)
        self._scan = self.scan_once = self._decoder.scan_once  # (text, index) -> (value, end)
        # The text buffer: the event just yielded is `buf[value_start:value_end]` (valid
        # until the next event is requested). Read-only for callers.
        self.buf = ""
        self._pos = 0
        self._consumed = 0  # characters dropped from the front of the buffer so far
        self._eof = False
        self._file = None
        self.value_start = self.value_end = 0
        self._on_start = self._stop = None
        self.first_at: int | None = None  # where the first event read began (characters)
        self.stopped_at: int | None = None  # where a range read stopped

    # -- reading ---------------------------------------------------------------------------
    def _open(self):
        try:
            with open(self.path, "rb") as f:
                magic = f.read(2)
        except FileNotFoundError:
            raise TraceFormatError(f"{self.path}: no such file") from None
        except OSError as e:
            raise TraceFormatError(f"{self.path}: unreadable ({e.strerror or e})") from None
        return open_trace(self.path, gz=magic == GZIP_MAGIC, encoding="utf-8", newline="")

    def _fill(self) -> bool:
        """Append the next chunk to the buffer (dropping what was consumed); False at EOF."""
        if self._eof:
            return False
        try:
            text = self._file.read(CHUNK_CHARS)
        except DATA_ERRORS as e:
            raise TraceFormatError(
                f"{self.path}: compressed data is corrupt or truncated ({e})"
            ) from None
        except UnicodeDecodeError as e:
            raise TraceFormatError(f"{self.path}: not UTF-8 text ({e.reason})") from None
        if not text:
            self._eof = True
            return False
        self._consumed += self._pos
        self.buf = self.buf[self._pos :] + text
        self._pos = 0
        return True

    def _truncated(self, what: str) -> TraceFormatError:
        return TraceFormatError(
            f"{self.path}: truncated: the file ends {what} (after {self.events_seen:,} events)"
        )

    def _malformed(self, msg: str, pos: int | None = None) -> TraceFormatError:
        where = self._consumed + (self._pos if pos is None else pos)
        return TraceFormatError(
            f"{self.path}: malformed JSON at character {where:,} "
            f"(after {self.events_seen:,} events): {msg}"
        )

    def _skip_ws(self) -> str:
        """Skip whitespace and return the next character ('' at end of input)."""
        while True:
            self._pos = _WS.match(self.buf, self._pos).end()
            if self._pos < len(self.buf):
                return self.buf[self._pos]
            if not self._fill():
                return ""

    def _value(self, what: str):
        """Decode one JSON value at the cursor, reading more text while it is incomplete;
        afterwards it spans `self.buf[self.value_start:self._pos]`."""
        if self._skip_ws() == "":
            raise self._truncated(f"where {what} was expected")
        while True:
            self.value_start = self._pos  # a refill moves the text to the buffer's front
            try:
                value, end = self._scan(self.buf, self._pos)
            except StopIteration as e:
                err_pos, msg = e.value, "expecting a value"
            except json.JSONDecodeError as e:
                err_pos, msg = e.pos, e.msg
            else:
                # A value touching the end of the buffer (a number) may go on in the next chunk.
                if end < len(self.buf) or not self._fill():
                    self._pos = end
                    return value
                continue
            # An error near the end of the buffer only means the value is not all read yet.
            incomplete = len(self.buf) - err_pos < 16 or msg.startswith("Unterminated")
            if incomplete and self._fill():
                continue
            # At the end of the file: cut short only if nothing but the end follows.
            if msg.startswith("Unterminated") or err_pos >= len(self.buf.rstrip()):
                raise self._truncated(f"inside {what}")
            raise self._malformed(f"{msg} in {what}", err_pos)

    def _skip_nested(self) -> None:
        """Move past the value at the cursor by matching brackets (no recursion), reading
        more text as needed; the state survives a refill, so a chunk boundary inside a
        string or an escape changes nothing."""
        depth, in_string, pos = 0, False, self._pos
        while True:
            buf = self.buf
            for m in _TOKEN.finditer(buf, pos):
                token = m.group()
                if token[0] == "\\":
                    if m.end() - m.start() == 1:  # a lone backslash at the buffer's end
                        break
                elif token == '"':
                    in_string = not in_string
                elif not in_string:
                    depth += 1 if token in "[{" else -1
                    if depth == 0:
                        self._pos = m.end()
                        return
                pos = m.end()
            else:
                pos = len(buf)
            start = self._pos
            if not self._fill():
                raise self._truncated("inside an event")
            pos -= start  # the buffer now starts at the cursor

    def _expect(self, chars: str, what: str) -> str:
        c = self._skip_ws()
        if c == "":
            raise self._truncated(f"where {what} was expected")
        if c not in chars:
            raise self._malformed(f"expected {what}, found {c!r}")
        self._pos += 1
        return c

    # -- the document ----------------------------------------------------------------------
    def events(
        self, on_start=None, *, start: int = 0, stop: int | None = None, decode_batch=None
    ) -> Iterator:
        """Yield every trace event; fill `header` with the other top-level keys.
        `on_start()` is called when the events begin (the header before them is read).
        `decode_batch`: yield the events a batch at a time instead, as that function
        decodes them (see `_batches`).

        A range (`start`, `stop`, in characters of the text) reads only part of the
        events, for parallel readers: from the first element boundary at or after
        `start` (found by pattern, so `first_at` must be checked against where the
        previous range stopped) up to the first element starting at or after `stop`
        (`stopped_at`; None when the array ended first). A batch read's stop may also be
        set while it runs (`stop_at`)."""
        self._on_start, self._stop = on_start, stop
        self.first_at = self.stopped_at = None
        with self._open() as self._file:
            if start > 0:
                if self._seek_element(start):
                    if decode_batch is None:
                        yield from self._array(skip_open=True)
                    else:
                        yield from self._batches(decode_batch)
                if self.stopped_at is None:
                    self._members(found=True)  # the keys after the array, the end
                return
            c = self._skip_ws()
            if c == "":
                raise TraceFormatError(f"{self.path}: empty file")
            array = self._array if decode_batch is None else lambda: self._batches(decode_batch)
            if c == "[":  # the JSON Array Format: a bare list of events
                self._pos += 1
                yield from array()
                return
            self._expect("{", "a JSON object or array")
            if self._skip_ws() == "}":
                self._pos += 1
                self._members(found=False, closed=True)
                return
            found = False
            while True:
                key = self._value("a key")
                if not isinstance(key, str):
                    raise self._malformed("a key that is not a string")
                self._expect(":", "':'")
                if key == "traceEvents":
                    self._expect("[", "the traceEvents array")
                    yield from array()
                    if self.stopped_at is not None:
                        return
                    self._members(found=True)
                    return
                self.header[key] = self._value(f"the value of {key!r}")
                if self._expect(",}", "',' or '}'") == "}":
                    break
            self._members(found=found, closed=True)

    def _members(self, *, found: bool, closed: bool = False) -> None:
        """The rest of the top-level object after a value: more keys, then its end."""
        while not closed:
            if self._expect(",}", "',' or '}'") == "}":
                break
            key = self._value("a key")
            if not isinstance(key, str):
                raise self._malformed("a key that is not a string")
            self._expect(":", "':'")
            self.header[key] = self._value(f"the value of {key!r}")
        if self._skip_ws() != "":
            raise self._malformed("extra data after the JSON document")
        if not found:
            raise TraceFormatError(f"{self.path}: no traceEvents array (not a Chrome trace)")

    def _seek_element(self, start: int) -> bool:
        """Move to the first `{` after a `},` whose position is >= `start`."""
        while self._consumed + len(self.buf) < start + CHUNK_CHARS // 4:
            self._pos = min(len(self.buf), max(0, start - 64 - self._consumed))
            if not self._fill():
                break
        self._pos = min(len(self.buf), max(0, start - 64 - self._consumed))
        while True:
            m = _BOUNDARY.search(self.buf, self._pos)
            while m is not None and self._consumed + m.start(1) < start:
                m = _BOUNDARY.search(self.buf, m.start(1))
            if m is not None and m.start(1) < len(self.buf) - 1:
                self._pos = m.start(1)
                return True
            self._pos = max(self._pos, len(self.buf) - 64)
            if not self._fill():
                self._pos = len(self.buf)
                return False

    @property
    def position(self) -> int:
        """Characters of the text before the cursor (between events: where the next begins)."""
        return self._consumed + self._pos

    def stop_at(self, stop: int | None) -> None:
        """End a batch read at the first element starting at or after `stop` (characters
        of the text; None: read to the end), unless the read has passed it already."""
        self._stop = stop

    def _stop_cut(self, pos: int):
        """The boundary before the first element starting at or after the stop, if it lies
        in the buffer (found as `_seek_element` finds a range's start); None otherwise."""
        limit = self._stop - self._consumed
        m = _BOUNDARY.search(self.buf, max(pos, limit - 64))
        while m is not None and m.start(1) < limit:
            m = _BOUNDARY.search(self.buf, m.start(1))
        return m if m is not None and m.start(1) < len(self.buf) - 1 else None

    def _batches(self, decode) -> Iterator:
        """The array's elements, about `BATCH_CHARS` of text at a time: `decode(text)`
        decodes the text of a JSON array (the batch's elements in brackets), or returns
        None when it is not one. Batches are cut at element boundaries found by pattern
        (`},{`, and `}]` at the end); a cut that fell inside an element (the pattern inside
        a string or nested args) fails to decode and the next one is tried, so a batch is
        never a wrong split. Raises BatchDecodeFailed when no cut decodes: the text is
        something only the exact reader (`_array`) can read or name the error in.

        With a stop (see `events`), the batch that reaches it is cut exactly before the
        first element at or after it; that cut must decode (then it is a real boundary:
        a cut inside a string or a nested value leaves the batch's text unclosed)."""
        if self._on_start is not None:
            self._on_start()
        if self._skip_ws() == "]":
            self._pos += 1
            return
        self.first_at = self._consumed + self._pos
        while True:
            while len(self.buf) - self._pos < BATCH_CHARS and self._fill():
                pass
            tries, ahead = 0, BATCH_CHARS  # where the next cut is searched, after the cursor
            while True:
                buf, pos = self.buf, self._pos
                if self._stop is not None and self._consumed + pos >= self._stop:
                    self.stopped_at = self._consumed + pos
                    return
                m = _BOUNDARY.search(buf, min(pos + ahead, len(buf)))
                if self._stop is not None and (
                    m is None or self._consumed + m.start(1) >= self._stop
                ):
                    stop = self._stop_cut(pos)
                    if stop is not None:
                        batch = decode("".join(("[", buf[pos : stop.start() + 1], "]")))
                        if batch is None:
                            raise StopCutFailed("the range's last cut does not decode")
                        self.events_seen += len(batch)
                        self._pos = stop.start(1)
                        self.stopped_at = self._consumed + self._pos
                        yield batch
                        return
                if m is None:
                    if self._fill():
                        continue  # the cut lies in text not read yet (`ahead` still holds)
                    yield from self._last_batch(decode)
                    return
                batch = decode("".join(("[", buf[pos : m.start() + 1], "]")))  # one copy less
                if batch is not None:
                    self.events_seen += len(batch)
                    self._pos = m.start(1)
                    yield batch
                    break
                tries += 1
                if tries >= MAX_CUTS:
                    raise BatchDecodeFailed(f"no cut decodes after {MAX_CUTS} tries")
                ahead = m.start(1) - pos

    def _last_batch(self, decode) -> Iterator:
        """The events up to the array's end (`}]`), once the whole rest is in the buffer."""
        buf, pos = self.buf, self._pos
        for m in itertools.islice(_END.finditer(buf, pos), MAX_CUTS):
            batch = decode("".join(("[", buf[pos : m.start() + 1], "]")))  # one copy less
            if batch is not None:
                self.events_seen += len(batch)
                self._pos = m.end()
                yield batch
                return
        raise BatchDecodeFailed("the end of the events array does not decode")

    def _array(self, skip_open: bool = False) -> Iterator[dict]:
        if self._on_start is not None:
            self._on_start()
        # The hot loop: one scan and one separator match per event; everything else is
        # the slow path taken near the end of the buffer or on bad input.
        scan, sep_match, stop = self._scan, _NEXT.match, self._stop
        if not skip_open and self._skip_ws() == "]":
            self._pos += 1
            return
        self.first_at = self._consumed + self._pos
        while True:
            buf, pos = self.buf, self._pos
            if stop is not None and self._consumed + pos >= stop:
                self.stopped_at = self._consumed + pos
                return
            try:
                event, end = scan(buf, pos)
            except (StopIteration, ValueError):
                end = -1
            except RecursionError:  # say, args nested 200,000 deep: skip the event
                self._skip_nested()
                self.too_deep += 1
                event, end = None, -2
            if end == -2:
                pass
            elif end == -1 or end >= len(buf):
                event = self._value("an event")
                buf = self.buf
            else:
                self.value_start = pos
                self._pos = end
            self.value_end = self._pos
            if end != -2:
                if event.__class__ is not dict:
                    raise self._malformed(f"event #{self.events_seen} is not a JSON object")
                self.events_seen += 1
                yield event
            buf = self.buf
            m = sep_match(buf, self._pos)
            if m is not None and m.end() < len(buf):
                self._pos = m.end()
                if m.group(1) == "]":
                    return
                continue
            if self._expect(",]", "',' or ']' after an event") == "]":
                return
            self._skip_ws()
