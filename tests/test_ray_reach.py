"""One reachability check before ray.init (ray_reach.py), for `import --ray-address` and
`run --ray`: Ray retries an address nobody listens on for minutes, so a dead HOST:PORT
is refused at once, in each command's one line; forms Ray resolves itself pass."""

from __future__ import annotations

import socket

import pytest

from perfdiag.errors import ConfigError
from perfdiag.ray_reach import ray_endpoint, unreachable


@pytest.mark.parametrize(
    ("address", "endpoint"),
    [
        ("10.0.0.5:6379", ("10.0.0.5", 6379)),
        ("ray://head:10001", ("head", 10001)),  # a Ray client address: its server's port
        ("[::1]:6379", ("::1", 6379)),
        (None, None),  # a local cluster
        ("", None),
        ("local", None),
        ("auto", None),  # Ray finds the cluster itself
        ("head", None),
        ("head:port", None),
    ],
)
def test_the_endpoint_of_an_address(address, endpoint):
    assert ray_endpoint(address) == endpoint


def test_a_closed_port_is_unreachable_and_a_listening_one_is_not():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert unreachable(f"127.0.0.1:{port}") is None
    assert isinstance(unreachable(f"127.0.0.1:{port}", timeout_s=2.0), OSError)
    assert unreachable("auto") is None and unreachable(None) is None


class _NoRay:
    """A `ray` that must not be reached: the check refuses the address before init."""

    def is_initialized(self) -> bool:
        return False

    def init(self, **kw):
        raise AssertionError("ray.init called for an unreachable address")


def test_run_refuses_a_dead_ray_client_address_in_its_line():
    """`run --ray ray://HOST:PORT` went to ray.init unchecked (the import checked it)."""
    from perfdiag.probes import ray_load

    says = r"^cannot reach the Ray cluster at ray://127\.0\.0\.1:1: "
    with pytest.raises(ConfigError, match=says):
        ray_load._connect(_NoRay(), "ray://127.0.0.1:1")
