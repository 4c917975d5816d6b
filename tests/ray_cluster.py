"""A local two-node Ray cluster for tests: a head and a second node on this machine.

Issue 40: CI tests placement, merging and failure handling without a real cluster. Each
node is its own `ray start --block` process with one CPU (so two one-CPU actors land one
per node under SPREAD) and a custom resource naming it. Ray 2.60 enables token
authentication: every process (both nodes, the driver, a CLI subprocess) gets the same
RAY_AUTH_MODE=token and RAY_AUTH_TOKEN, which `cluster.env` carries.

Each node runs in a session of its own, so stopping kills exactly its process group:
never `ray stop`, which would stop every Ray on the machine (another engineer's too).

    with local_cluster() as cluster:      # or: cluster = start_cluster(); cluster.stop()
        ray.init(address=cluster.address)  # os.environ already carries the token
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

RAY = Path(sys.executable).with_name("ray")
NODE_RESOURCE = "perfdiag_node_{}"  # node i offers {NODE_RESOURCE.format(i): 1}
AUTH_KEYS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")


def ray_installed() -> bool:
    """Whether Ray is installed, without importing it: Ray reads RAY_AUTH_MODE once, when
    first imported, so importing it before start_cluster sets the token would leave this
    process unable to join."""
    import importlib.util

    return importlib.util.find_spec("ray") is not None and RAY.exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LocalCluster:
    address: str  # "127.0.0.1:PORT", what `ray.init(address=...)` and --ray take
    env: dict[str, str]  # the auth variables a driver or CLI subprocess needs
    temp_dir: Path
    nodes: list[subprocess.Popen] = field(default_factory=list)
    _saved_env: dict[str, str | None] = field(default_factory=dict)

    def subprocess_env(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def stop(self) -> None:
        """Kill both nodes' process groups (TERM, then KILL) and remove the temp dir."""
        for proc in reversed(self.nodes):
            _kill_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 3  # then KILL: a throwaway cluster needs no tidy exit
        for proc in reversed(self.nodes):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            _kill_group(proc, signal.SIGKILL)  # the raylet's workers outlive `ray start`
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self.nodes.clear()
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env.clear()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _start_node(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [str(RAY), "start", "--block", "--disable-usage-stats", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() kills only this node
        )


def _wait_for_nodes(cluster: LocalCluster, count: int, timeout: float) -> None:
    """Until the head lists `count` alive nodes (asked from a subprocess: this process
    keeps no Ray connection of its own)."""
    probe = (
        "import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR');"
        "print(sum(n['Alive'] for n in ray.nodes()))"
    )
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        for proc in cluster.nodes:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"a ray node exited ({proc.returncode}); logs under {cluster.temp_dir}"
                )
        done = subprocess.run(
            [sys.executable, "-c", probe, cluster.address],
            env=cluster.subprocess_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        last = done.stdout.strip().splitlines()[-1:] or done.stderr[-300:]
        if done.returncode == 0 and done.stdout.strip().endswith(str(count)):
            return
        time.sleep(0.5)
    raise RuntimeError(f"the local ray cluster did not reach {count} nodes: {last}")


def start_cluster(num_nodes: int = 2, cpus_per_node: int = 1, timeout: float = 90) -> LocalCluster:
    """Start a head and num_nodes - 1 more nodes on this machine; sets the auth variables
    in os.environ (restored by stop()) so this process's ray.init joins it."""
    temp_dir = Path(tempfile.mkdtemp(prefix="ray_", dir="/tmp"))  # short: socket paths
    port = _free_port()
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    cluster = LocalCluster(address=f"127.0.0.1:{port}", env=env, temp_dir=temp_dir)
    cluster._saved_env = {key: os.environ.get(key) for key in AUTH_KEYS}
    os.environ.update(env)
    common = [
        f"--num-cpus={cpus_per_node}",
        "--num-gpus=0",
        "--object-store-memory=100000000",
        "--node-ip-address=127.0.0.1",
    ]
    try:
        cluster.nodes.append(
            _start_node(
                [
                    "--head",
                    f"--port={port}",
                    "--include-dashboard=false",
                    f"--temp-dir={temp_dir}",
                    f'--resources={{"{NODE_RESOURCE.format(0)}": 1}}',
                    *common,
                ],
                cluster.subprocess_env(),
                temp_dir / "head.log",
            )
        )
        _wait_for_nodes(cluster, 1, timeout)
        for i in range(1, num_nodes):
            cluster.nodes.append(
                _start_node(
                    [
                        f"--address={cluster.address}",
                        f'--resources={{"{NODE_RESOURCE.format(i)}": 1}}',
                        *common,
                    ],
                    cluster.subprocess_env(),
                    temp_dir / f"node{i}.log",
                )
            )
        _wait_for_nodes(cluster, num_nodes, timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


@contextlib.contextmanager
def local_cluster(num_nodes: int = 2, cpus_per_node: int = 1):
    cluster = start_cluster(num_nodes, cpus_per_node)
    try:
        yield cluster
    finally:
        cluster.stop()
