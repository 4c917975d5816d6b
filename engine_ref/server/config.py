"""The server's own settings (the engine has its own `EngineConfig`): frozen, validated."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import ConfigError


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"  # loopback unless told otherwise: a server is not public by default
    port: int = 8000  # 0: an ephemeral port (tests)
    model_name: str = "engine_ref"  # the id /v1/models lists and requests must name
    api_key: str | None = None  # when set, /v1/* needs `Authorization: Bearer <key>`
    # Back-pressure: requests accepted but not yet admitted by the scheduler (new or put
    # back by a recompute preemption). Past this, new requests get 429 + Retry-After.
    max_waiting: int = 256
    request_timeout_s: float | None = 600.0  # from receipt to the last token; None: none
    max_body_bytes: int = 8 * 2**20

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in [0, 65535], got {self.port}")
        if self.max_waiting < 1:
            raise ConfigError(f"max_waiting must be >= 1, got {self.max_waiting}")
        t = self.request_timeout_s
        if t is not None and not (math.isfinite(t) and t > 0):
            raise ConfigError(f"request timeout must be > 0 seconds, got {t}")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("an API key must not be empty")
        if not self.model_name:
            raise ConfigError("the served model name must not be empty")
