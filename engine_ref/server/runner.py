"""Start and stop the server: in-process (tests, the benchmark) or until a signal (the CLI).

Shutdown order matters for "no request silently lost": the engine loop ends every open
stream first (each gets an error event and a record), then aiohttp closes the listener
and waits briefly for the handlers to finish writing.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from aiohttp import web

from .app import Server
from .config import ServerConfig
from .events import ServerObserver

SHUTDOWN_TIMEOUT_S = 5.0


class RunningServer:
    def __init__(self, server: Server, runner: web.AppRunner, host: str, port: int):
        self.server, self._runner = server, runner
        self.host, self.port = host, port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def engine(self):
        return self.server.engine

    async def stop(self) -> None:
        await self.server.loop.close()
        await self._runner.cleanup()

    async def __aenter__(self) -> RunningServer:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()


async def start_server(engine, config: ServerConfig | None = None,
                       observer: ServerObserver | None = None,
                       run_id: str | None = None) -> RunningServer:  # fmt: skip
    """Serve `engine` on config.host:config.port (port 0: an ephemeral one)."""
    config = config or ServerConfig(port=0)
    server = Server(engine, config, observer)
    server.run_id = run_id
    # handler_cancellation: a client that disconnects cancels its handler at once, even
    # while it waits in the queue, so its request is aborted and its KV freed.
    runner = web.AppRunner(server.app(), handler_cancellation=True, access_log=None,
                           shutdown_timeout=SHUTDOWN_TIMEOUT_S)  # fmt: skip
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        from ...errors import ConfigError

        raise ConfigError(f"cannot listen on {config.host}:{config.port}: {e.strerror}") from None
    host, port = runner.addresses[0][:2]
    return RunningServer(server, runner, host, port)


def serve_forever(engine, config: ServerConfig, observer: ServerObserver | None = None,
                  run_id: str | None = None,
                  on_ready: Callable[[RunningServer], None] | None = None) -> None:  # fmt: skip
    """Serve until SIGINT or SIGTERM, then shut down cleanly."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        running = await start_server(engine, config, observer, run_id)
        try:
            if on_ready is not None:
                on_ready(running)
            await stop.wait()
        finally:
            await running.stop()

    asyncio.run(main())


class ServerThread:
    """The server on its own event loop in a background thread, for callers that run
    their own loop (a load client under `asyncio.run`, a notebook, a test)."""

    def __init__(self, engine, config: ServerConfig | None = None,
                 observer: ServerObserver | None = None, run_id: str | None = None):  # fmt: skip
        import threading

        self._args = (engine, config or ServerConfig(port=0), observer, run_id)
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.running: RunningServer | None = None
        self._thread = threading.Thread(target=self._main, name="perfdiag-server", daemon=True)

    def start(self) -> ServerThread:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    @property
    def url(self) -> str:
        return self.running.url

    def _main(self) -> None:
        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            try:
                self.running = await start_server(*self._args)
            except BaseException as e:
                self._error = e
                self._ready.set()
                return
            self._ready.set()
            try:
                await self._stop.wait()
            finally:
                await self.running.stop()

        asyncio.run(main())

    def stop(self) -> None:
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
