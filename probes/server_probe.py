"""Server-side probes: `perfdiag serve` records a run, like `perfdiag run` does.

The engine's hook events go through the usual `RunRecorder` (so every analyzer reads the
server's run as an engine-side run: `perfdiag analyze` falls back to engine timestamps
when there are no client events); the HTTP layer's events land beside them on the
`server` side (http_received, response_start, sse_chunk, response_end), and each HTTP
generation request gets one `requests` row with its outcome, so every request the server
saw is accounted for.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from ..engine_ref.server.events import ServerObserver, ServerRequestRecord
from ..traces import environment
from ..traces.writer import RunWriter
from .device_sampler import DeviceSampler
from .recorder import RunRecorder


class ServerRecorder(RunRecorder, ServerObserver):
    def http_event(self, request_id: str, kind: str, ts_ns: int, num_tokens: int | None = None,
                   detail: str | None = None) -> None:  # fmt: skip
        self._event((request_id, kind, ts_ns, "server", None, num_tokens, detail, None))

    def request_end(self, r: ServerRequestRecord) -> None:
        args = json.dumps({"endpoint": r.endpoint, "status": r.status, "stream": r.stream})
        self._request((r.request_id, r.prompt_tokens, r.output_tokens,
                       self._cached.get(r.request_id), r.finish_reason, False, None,
                       r.output_digest, r.error, args, None))  # fmt: skip


class ServerRun:
    """The server's run directory while it serves: writer, recorder, device sampler."""

    def __init__(self, out_dir: Path, engine, server_config, command: list[str] | None = None,
                 device_sampling: bool = True, sample_period_s: float = 0.2):  # fmt: skip
        self.writer = RunWriter(
            Path(out_dir),
            command=list(sys.argv if command is None else command),
            config={
                "server": dataclasses.asdict(server_config) | {"api_key": None},
                "engine_config": dataclasses.asdict(engine.config),
                "num_kv_blocks": engine.block_manager.num_blocks,
            },
            environment_info=environment.fingerprint(deep=True),
        )
        self.recorder = ServerRecorder(self.writer)
        engine.observer = self.recorder  # the server's engine loop tees in front of it
        self.sampler = None
        if device_sampling:
            self.sampler = DeviceSampler(self.writer.table("counters").append,
                                         sample_period_s).start()  # fmt: skip

    @property
    def run_id(self) -> str:
        return self.writer.manifest.run_id

    def close(self, status: str) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        self.writer.close(status)
