"""What the server tells an observer (perfdiag's probes) about each HTTP request.

Like the engine's hooks, this is the only thing the server knows of recording: one
optional observer, no-op methods, timestamps from `time.monotonic_ns()` taken by the
server. The engine's own events reach the engine's observer as usual.

Kinds (recorded on the `server` side of a run's request events):
  http_received   the request's headers were read and routed (before the body is read)
  response_start  the response headers are being sent (detail: the status code)
  sse_chunk       one Server-Sent Event carrying output was written (num_tokens: its tokens)
  response_end    the response is complete or abandoned (detail: the finish reason)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServerRequestRecord:
    """One HTTP generation request, once it has ended (every one: served or not)."""

    request_id: str
    endpoint: str
    status: int  # the HTTP status sent (or 499 when the client left before any)
    finish_reason: str  # stop | length | cancelled | timeout | rejected | error
    prompt_tokens: int | None = None
    output_tokens: int = 0
    stream: bool = False
    error: str | None = None
    output_digest: str | None = None


class ServerObserver:
    """Base class with no-op methods: subclass and override what you record."""

    def http_event(self, request_id: str, kind: str, ts_ns: int, num_tokens: int | None = None,
                   detail: str | None = None) -> None:  # fmt: skip
        pass

    def request_end(self, record: ServerRequestRecord) -> None:
        pass
