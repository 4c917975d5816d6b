"""`perfdiag run --launch "CMD"`: start an inference server, wait until it is healthy,
hand back its URL, and stop it afterwards, leaving nothing running.

The server runs in its own process group (its own session: a terminal's Ctrl-C reaches
perfdiag only), its stdout and stderr go to one log file, and `stop()` ends the whole
group: SIGTERM, a grace period, then SIGKILL. A server that exits or never becomes
healthy is a one-line `ServerStartError` that names the most telling line of its log.

The launch command is also read as data (probes/server_args.py): the settings a run
records and which server it is.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from .server_args import parse_server_args, with_flag

POLL_S = 0.5  # between two /health checks
STOP_GRACE_S = 20.0
TELLING_CHARS = 200  # the log line quoted in an error
RUN_LOG = "server/server.log"  # the server's log, in the run directory
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ERROR_WORDS = re.compile(r"Error|error|ERROR|Exception")
_EXCEPTION = re.compile(r"\b\w*(Error|Exception): ")  # Python's "ValueError: message"
_SEE_ABOVE = re.compile(r"see .*above", re.IGNORECASE)


class ServerStartError(ConfigError):
    """The launched server exited, or was not healthy in time; `reason` is the line
    without the log's location, so a caller that moves the log can say where it went."""

    def __init__(self, reason: str, log_path: Path | None):
        self.reason, self.log_path = reason, log_path
        super().__init__(f"{reason} (log: {log_path})" if log_path is not None else reason)

    def with_log(self, log_path: Path | None) -> ServerStartError:
        return ServerStartError(self.reason, log_path)


@dataclass(frozen=True)
class LaunchSpec:
    """A server command line (split as a shell would; leading NAME=VALUE words set its
    environment, as in a shell) and how long it may take to become healthy."""

    command: str
    startup_timeout_s: float = 600.0
    env: dict = field(default_factory=dict)  # extra environment variables
    host: str = "127.0.0.1"  # where perfdiag reaches it

    def __post_init__(self) -> None:
        if not self.argv:
            raise ConfigError(f"--launch needs a server command, got {self.command!r}")
        if not (math.isfinite(self.startup_timeout_s) and self.startup_timeout_s > 0):
            raise ConfigError(
                f"the server's startup timeout must be > 0 s, got {self.startup_timeout_s}"
            )

    @property
    def words(self) -> list[str]:
        try:
            return shlex.split(self.command)
        except ValueError as e:  # an unclosed quote
            raise ConfigError(f"cannot read the --launch command {self.command!r}: {e}") from None

    @property
    def argv(self) -> list[str]:
        """The command without its leading NAME=VALUE words."""
        words = self.words
        while words and _ASSIGNMENT.match(words[0]):
            words.pop(0)
        return words

    @property
    def extra_env(self) -> dict[str, str]:
        """`env` and the command's leading NAME=VALUE words (these win)."""
        extra = {str(k): str(v) for k, v in self.env.items()}
        for word in self.words:
            if not _ASSIGNMENT.match(word):
                break
            name, _, value = word.partition("=")
            extra[name] = value
        return extra


# ---- the command line as data -----------------------------------------------------------
def port_of(argv: list[str]) -> int | None:
    """The value of the command's `--port N` / `--port=N` (None: not given)."""
    for i, word in enumerate(argv):
        value = None
        if word == "--port" and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith("--port="):
            value = word.partition("=")[2]
        if value is not None:
            try:
                return int(value)
            except ValueError:
                raise ConfigError(
                    f"the server command's --port is not a number: {value!r}"
                ) from None
    return None


def with_port(argv: list[str], host: str = "127.0.0.1") -> tuple[list[str], int]:
    """The command with a definite port: its own `--port N`, else a free one appended
    (`--port 0` also gets a free one: perfdiag must know where to connect)."""
    port = port_of(argv)
    if port is not None and port != 0:
        return list(argv), port
    port = free_port(host)
    return with_flag(argv, "--port", port), port  # a `--port 0` replaced


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def telling_line(log_path: Path, tail_bytes: int = 65536) -> str:
    """The log's last line that names an error or exception, else its last non-empty
    line, trimmed; "" for an empty or unreadable log."""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - tail_bytes))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [_ANSI.sub("", line).strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return ""
    # A wrapper's line ("RuntimeError: Engine core initialization failed. See root cause
    # above.") points at the root cause: the last exception line that does not, wins.
    errors = [x for x in lines if _ERROR_WORDS.search(x)]
    roots = [x for x in errors if _EXCEPTION.search(x) and not _SEE_ABOVE.search(x)]
    line = (roots or errors or lines)[-1]
    return line if len(line) <= TELLING_CHARS else line[: TELLING_CHARS - 1] + "…"


# ---- the process -------------------------------------------------------------------------
class LaunchedServer:
    """A server started by `launch`: healthy at `url`. `stop()` ends its process group."""

    def __init__(self, proc: subprocess.Popen, argv: list[str], url: str, log_path: Path):
        self.proc, self.argv, self.url, self.log_path = proc, argv, url, Path(log_path)
        self.pid = self.pgid = proc.pid  # a new session: its leader's pid names the group
        self.startup_s: float | None = None
        self.exit_code: int | None = None
        self._stopped = False
        self._copy_log_to: Path | None = None
        self.staging: Path | None = None  # a folder of its own, removed when it stops

    def move_log(self, dest: Path) -> None:
        """Move the log to `dest` (the run directory) while the server keeps writing it:
        a rename keeps its open file; across file systems it is copied when it stops."""
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(self.log_path, dest)
        except OSError:
            self._copy_log_to = dest
            return
        self.log_path = dest
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging = None

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM to the whole group, up to `grace_s` for it to end, then SIGKILL.
        Idempotent; returns the server's exit code (negative: the signal that ended it)."""
        if self._stopped:
            return self.exit_code
        try:
            if self._group_alive():
                self._signal(signal.SIGTERM)
                self._wait_group(time.monotonic() + grace_s)
        finally:  # also when interrupted while waiting: nothing is left running
            if self._group_alive():
                self._signal(signal.SIGKILL)
                self._wait_group(time.monotonic() + 5.0)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5.0)
            self.exit_code = self.proc.returncode
            self._stopped = True
            self._finish_log()
        return self.exit_code

    def _finish_log(self) -> None:
        if self._copy_log_to is not None:
            with contextlib.suppress(OSError):
                shutil.copyfile(self.log_path, self._copy_log_to)
                self.log_path.unlink()
                self.log_path = self._copy_log_to
            self._copy_log_to = None
        if self.staging is not None:  # a log still there belonged to no run
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging = None

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, sig)

    def _group_alive(self) -> bool:
        self.proc.poll()  # reap the leader: a zombie still counts as a member
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # Members orphaned by the leader may be zombies that nobody reaps (a container
        # whose first process does not): they hold nothing, so they do not count.
        return _live_members(self.pgid) != 0

    def _wait_group(self, deadline: float) -> None:
        while self._group_alive() and time.monotonic() < deadline:
            time.sleep(0.05)

    def wait_healthy(self, timeout_s: float) -> float:
        """Poll /health until it answers 200: the seconds it took. ServerStartError when
        the process exits first or the time runs out."""
        started = time.monotonic()
        deadline = started + timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerStartError(self._exited(code), self.log_path)
            if _healthy(f"{self.url}/health"):
                self.startup_s = time.monotonic() - started
                return self.startup_s
            if time.monotonic() >= deadline:
                last = telling_line(self.log_path)
                raise ServerStartError(
                    f"the server was not healthy after {timeout_s:g} s "
                    f"(no 200 from {self.url}/health)"
                    + (f"; its log ends: {last}" if last else ""),
                    self.log_path,
                )
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))

    def _exited(self, code: int) -> str:
        how = f"was killed by {_signal_name(-code)}" if code < 0 else f"exited with code {code}"
        line = telling_line(self.log_path)
        return f"the server {how} before it was healthy" + (f": {line}" if line else "")

    def __enter__(self) -> LaunchedServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _live_members(pgid: int) -> int | None:
    """How many processes of the group are not zombies; None where /proc cannot say."""
    try:
        pids = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return None
    live = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()  # after the command's name
        except OSError:
            continue  # gone meanwhile
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            live += 1
    return live


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def launch(spec: LaunchSpec, log_path: Path) -> LaunchedServer:
    """Start `spec`'s command in its own process group, its output into `log_path`,
    and wait until it is healthy. Nothing is left running when this raises."""
    argv, port = with_port(spec.argv, spec.host)
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **spec.extra_env}
    with open(log_path, "wb") as log:  # the child keeps its own descriptor
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)  # fmt: skip
        except FileNotFoundError:
            raise ConfigError(f"server command not found: {argv[0]}") from None
        except PermissionError:
            raise ConfigError(f"server command not executable: {argv[0]}") from None
        except OSError as e:
            raise ConfigError(f"cannot start the server command {argv[0]}: {e.strerror}") from None
    server = LaunchedServer(proc, argv, f"http://{spec.host}:{port}", log_path)
    try:
        server.wait_healthy(spec.startup_timeout_s)
    except BaseException:  # exited, timed out, Ctrl-C, SIGTERM: leave nothing running
        server.stop(grace_s=5.0)
        raise
    return server


def launch_for_run(spec: LaunchSpec, run_dir: Path) -> LaunchedServer:
    """`launch` for a run whose directory must stay empty until its writer opens it: the
    log starts in a folder of its own beside it, and `move_log(run_dir / RUN_LOG)` takes
    it in. The log of a server that does not start is kept in the temp folder, named in
    the error (the run directory is left as it was)."""
    run_dir = Path(run_dir)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{run_dir.name}.server-", dir=run_dir.parent))
    except OSError:  # a parent this process cannot write: the log is copied in at the end
        staging = Path(tempfile.mkdtemp(prefix="perfdiag-server-"))
    try:
        server = launch(spec, staging / "server.log")
    except ServerStartError as e:
        kept = _keep(e.log_path)
        shutil.rmtree(staging, ignore_errors=True)
        raise e.with_log(kept) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    server.staging = staging
    return server


def _keep(log_path: Path | None) -> Path | None:
    """The log of a server that did not start, moved to a temp folder of its own."""
    if log_path is None or not log_path.exists():
        return None
    try:
        kept = Path(tempfile.mkdtemp(prefix="perfdiag-server-")) / "server.log"
        shutil.move(log_path, kept)
    except OSError:
        return None
    return kept


def launch_record(server: LaunchedServer, spec: LaunchSpec, log: str) -> dict:
    """The manifest's `server.launch`: what was started and how it went (`exit_code` is
    filled in when it stops)."""
    return {
        "argv": list(server.argv),
        "args": parse_server_args(server.argv),
        "env": spec.extra_env,
        "log": log,
        "startup_s": server.startup_s,
        "exit_code": server.exit_code,
    }


async def server_facts(session, url: str, headers: dict) -> dict:
    """What the server says of itself: `version` (GET /version, vLLM) and `models` (the
    /v1/models `data` list as it came), each None when it does not say."""
    out: dict = {"version": None, "models": None}
    for key, path, field_name in (("version", "/version", "version"),
                                  ("models", "/v1/models", "data")):  # fmt: skip
        try:
            async with session.get(f"{url}{path}", headers=headers) as resp:
                body = await resp.json(content_type=None) if resp.status == 200 else None
        except Exception:  # a server that does not say is not an error
            body = None
        value = body.get(field_name) if isinstance(body, dict) else None
        if key == "models":
            out[key] = value if isinstance(value, list) else None
        elif value is not None:
            out[key] = str(value)
    return out
