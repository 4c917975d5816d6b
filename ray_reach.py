"""Does a Ray cluster's address answer? Asked before ray.init, which retries an address
nobody listens on for minutes (its C++ warnings all the while). Shared by the Ray import
(traces/importers/ray_import.py) and the Ray load (probes/ray_load.py), each of which
words its own one-line error. Imports no Ray."""

from __future__ import annotations

import socket

REACH_TIMEOUT_S = 5.0  # a cluster's GCS (or client server) port answers at once when up


def ray_endpoint(address: str | None) -> tuple[str, int] | None:
    """(host, port) of `HOST:PORT`, `[IPv6]:PORT` or `ray://HOST:PORT`; None for a local
    cluster (None, "", "local"), "auto" and any form Ray resolves or refuses itself."""
    host, sep, port = (address or "").removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit() or "://" in host:
        return None
    return host.strip("[]"), int(port)


def unreachable(address: str | None, timeout_s: float = REACH_TIMEOUT_S) -> OSError | None:
    """Why `address` does not answer now (the connection's error); None when it does, or
    when it is no host and port to try."""
    endpoint = ray_endpoint(address)
    if endpoint is None:
        return None
    try:
        socket.create_connection(endpoint, timeout=timeout_s).close()
    except OSError as e:
        return e
    return None
