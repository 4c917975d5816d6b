"""engine_ref behind an OpenAI-compatible HTTP API (aiohttp): `perfdiag serve`.

    from perfdiag.engine_ref.server import ServerConfig, start_server
    async with await start_server(engine, ServerConfig(port=0)) as running:
        ...  # POST {running.url}/v1/completions

See docs/serving.md.
"""

from .app import Server
from .config import ServerConfig
from .events import ServerObserver, ServerRequestRecord
from .runner import RunningServer, ServerThread, serve_forever, start_server

__all__ = [
    "RunningServer",
    "Server",
    "ServerConfig",
    "ServerObserver",
    "ServerRequestRecord",
    "ServerThread",
    "serve_forever",
    "start_server",
]
