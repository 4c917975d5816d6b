"""`perfdiag run --launch "vllm serve …" --server-profile START:END`: vLLM's own torch
profiler over a window of the workload, its traces kept and imported into the run.

perfdiag appends `--profiler-config {json}` to the launch command, its
`torch_profiler_dir` a hidden folder beside the run (the run directory must stay empty
until its writer opens it); START seconds after the workload starts it posts
`/start_profile`, at END (or when the workload ends, whichever comes first)
`/stop_profile`, then waits (bounded) until the trace files exist and stop growing, before
the server is stopped. Once it has stopped the folder becomes the run's `server/profile/`,
the worker traces are imported as the run `server/trace/` and the front end's (AsyncLLM's
own CPU trace, `….async_llm.….pt.trace.json.gz`) as `server/trace-frontend/`. Nothing here
fails a run: a call that fails, a trace that never comes or does not import, is a warning
in the manifest's `config.server.profile`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import shlex
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from .server_args import parse_server_args, server_kind, with_flag
from .server_launch import LaunchSpec

PROFILE_DIR = "server/profile"  # vLLM's trace files, as it wrote them
TRACE_RUN = "server/trace"  # the worker traces, imported
FRONTEND_RUN = "server/trace-frontend"  # the API server's (AsyncLLM's) CPU trace, imported
FLAG = "--profiler-config"
TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")  # torch's tensorboard_trace_handler
WAIT_S = 120.0  # for the trace files after /stop_profile
INTERRUPTED_WAIT_S = 15.0  # the same when the run was interrupted
POLL_S = 0.5
STABLE_POLLS = 2  # sizes unchanged over this many polls: written
STALL_NOTE_S = 1.0  # a /stop_profile this long is said: the engine stood still meanwhile
CALL_TIMEOUT_S = 120.0  # /stop_profile returns once the workers have written their traces
WORKER_RANK = re.compile(r"(?:^|_)rank(\d+)\.\d+\.pt\.trace\.json")  # vLLM's worker name


@dataclass(frozen=True)
class ServerProfileSpec:
    """The window, in seconds after the workload starts; `end_s` None: to its end."""

    start_s: float
    end_s: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start_s) and self.start_s >= 0):
            raise ConfigError(f"--server-profile: START must be >= 0 s, got {self.start_s:g}")
        if self.end_s is not None and not (math.isfinite(self.end_s) and self.end_s > self.start_s):
            raise ConfigError(f"--server-profile: END must be after START ({self.start_s:g} s), "
                              f"got {self.end_s:g}")  # fmt: skip

    @classmethod
    def parse(cls, text: str) -> ServerProfileSpec:
        """`START:END`, `START:` or `START` (to the workload's end); seconds."""
        start, _, end = text.strip().partition(":")
        try:
            return cls(float(start) if start.strip() else 0.0,
                       float(end) if end.strip() else None)  # fmt: skip
        except ValueError:
            raise ConfigError(
                f"bad --server-profile {text!r}: use START:END in seconds after the workload "
                "starts, e.g. 2:5 (END left out: to its end)"
            ) from None


def check_launch(launch: LaunchSpec | None) -> None:
    """A window needs a vLLM that perfdiag launches (with its profiler on); else why not."""
    if launch is None:
        raise ConfigError("--server-profile needs --launch: perfdiag turns vLLM's profiler on "
                          "in the command it starts")  # fmt: skip
    kind = server_kind(launch.argv)
    if kind != "vllm":
        raise ConfigError(f"--server-profile records vLLM's torch profiler; the --launch command "
                          f"is not vLLM's (`{launch.argv[0]}`: {kind})")  # fmt: skip
    if any(w == FLAG or w.startswith((FLAG + "=", FLAG + ".")) for w in launch.argv):
        raise ConfigError(f"--server-profile sets vLLM's {FLAG} itself: remove it from the "
                          "--launch command")  # fmt: skip


def profiler_config(trace_dir: Path) -> dict:
    """What perfdiag asks of vLLM's profiler. vLLM's engine stops while a worker writes
    its trace (after /stop_profile; requests in flight wait), so the least to write: no
    Python stacks, no shapes (a CPU trace twice as large, and a slower summary table),
    no gzip (perfdiag compresses the traces once the server has stopped), no device-time
    table."""
    return {"profiler": "torch", "torch_profiler_dir": str(Path(trace_dir).resolve()),
            "torch_profiler_with_stack": False, "torch_profiler_record_shapes": False,
            "torch_profiler_use_gzip": False,
            "torch_profiler_dump_cuda_time_total": False}  # fmt: skip


def without_flag(argv: list[str]) -> list[str]:
    """The command as the user gave it (`launch.argv` is what a relaunch starts)."""
    return with_flag(list(argv), FLAG, None)


@dataclass
class Call:
    """One POST on the run's monotonic clock (sent, answered) and wall clock."""

    path: str
    sent_ns: int
    sent_wall_ns: int
    answered_ns: int | None = None
    answered_wall_ns: int | None = None
    status: int | None = None
    error: str | None = None


class ServerProfiler:
    """One profiling window of a launched vLLM: `launch_spec` before it starts, `begin`
    when the workload starts, `end` when it ends, `wait_written` before the server stops,
    `collect` once it has stopped, `record()` the manifest's section; `discard` always."""

    def __init__(self, spec: ServerProfileSpec, run_dir: Path):
        self.spec, self.run_dir = spec, Path(run_dir)
        try:
            self.staging: Path | None = Path(tempfile.mkdtemp(
                prefix=f".{self.run_dir.name}.profile-", dir=self.run_dir.parent))  # fmt: skip
        except OSError:  # a parent this process cannot write: a temp folder, moved at the end
            self.staging = Path(tempfile.mkdtemp(prefix="perfdiag-profile-"))
        self.flag = [FLAG, json.dumps(profiler_config(self.staging), separators=(",", ":"))]
        self.calls: dict[str, Call] = {}
        self.warnings: list[str] = []
        self.files: list[str] = []
        self.workload_start_ns: int | None = None
        self.trace_run = self.frontend_run = self.alignment = None
        self.dir: str | None = None
        self._done: asyncio.Event | None = None  # made in begin, inside the loop
        self._task: asyncio.Task | None = None
        self._waited = False

    def launch_spec(self, launch: LaunchSpec) -> LaunchSpec:
        command = f"{launch.command} {shlex.join(self.flag)}"
        return LaunchSpec(command, startup_timeout_s=launch.startup_timeout_s,
                          env=dict(launch.env), host=launch.host)  # fmt: skip

    def unflagged(self, launched: dict | None) -> dict | None:
        """The manifest's `launch` without perfdiag's flag (it is `profile.launch_flag`)."""
        if launched is None:
            return None
        argv = without_flag(launched["argv"])
        return {**launched, "argv": argv, "args": parse_server_args(argv)}

    # ---- during the run ------------------------------------------------------------------
    def begin(self, session, url: str, headers: dict) -> None:
        """The workload starts now: the window is timed from here."""
        self.workload_start_ns = time.monotonic_ns()
        self._done = asyncio.Event()
        self._task = asyncio.create_task(self._window(session, url, headers))

    async def _window(self, session, url: str, headers: dict) -> None:
        if await self._until(self.spec.start_s):
            return  # the workload ended first: nothing to profile
        await self._post(session, url, headers, "/start_profile")
        if self.calls["/start_profile"].status != 200:
            return
        await self._until(self.spec.end_s)
        await self._post(session, url, headers, "/stop_profile")

    async def _until(self, at_s: float | None) -> bool:
        """Wait until `at_s` after the workload started (None: its end); True when the
        workload ended first."""
        timeout = None
        if at_s is not None:
            timeout = max(0.0, self.workload_start_ns / 1e9 + at_s - time.monotonic_ns() / 1e9)
        try:
            await asyncio.wait_for(self._done.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    async def _post(self, session, url: str, headers: dict, path: str) -> None:
        call = self.calls[path] = Call(path, time.monotonic_ns(), time.time_ns())
        body = ""

        async def post() -> None:
            nonlocal body
            async with session.post(f"{url}{path}", headers=headers) as resp:
                call.status = resp.status
                body = (await resp.text())[:200] if resp.status != 200 else ""

        try:
            await asyncio.wait_for(post(), CALL_TIMEOUT_S)
        except asyncio.TimeoutError:
            call.error = f"no answer in {CALL_TIMEOUT_S:g} s"
        except Exception as e:  # a failed call is a warning, never a failed run
            call.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        call.answered_ns, call.answered_wall_ns = time.monotonic_ns(), time.time_ns()
        if call.status != 200:
            said = f": {body.strip()}" if body.strip() else ""
            why = call.error or f"status {call.status}{said}"
            self.warnings.append(f"POST {path} failed ({why})")

    async def end(self) -> None:
        """The workload ended (or failed): stop the profiler if it runs. Idempotent."""
        if self._task is None or self._done.is_set():
            return
        self._done.set()
        with contextlib.suppress(Exception):
            await self._task
        stop = self.calls.get("/stop_profile")
        if stop is not None and stop.status == 200:
            took = (stop.answered_ns - stop.sent_ns) / 1e9
            if took >= STALL_NOTE_S:
                at = (stop.sent_ns - self.workload_start_ns) / 1e9
                self.warnings.append(
                    f"/stop_profile took {took:.1f} s: vLLM's engine writes its trace before it "
                    f"steps again, so the requests in flight waited (the client's figures from "
                    f"{at:.1f} to {at + took:.1f} s into the workload include it)"
                )
        if "/start_profile" not in self.calls:
            ran = (time.monotonic_ns() - self.workload_start_ns) / 1e9
            self.warnings.append(
                f"the workload ended {ran:.1f} s after it started, before the window's start "
                f"({self.spec.start_s:g} s): nothing profiled"
            )

    @property
    def profiled(self) -> bool:
        """vLLM's profiler was started (its traces are then expected)."""
        start = self.calls.get("/start_profile")
        return start is not None and start.status == 200

    async def wait_written(self, timeout_s: float = WAIT_S, workers: int = 1) -> None:
        """Until `workers` worker traces exist and no file in the folder grows any more
        (bounded): they are written after /stop_profile, perhaps after it answered. Not
        when the stop failed: vLLM then writes them only as it shuts down."""
        stop = self.calls.get("/stop_profile")
        if not self.profiled or stop is None or stop.status != 200:
            return
        if self.staging is None or self._waited:
            return
        self._waited = True
        deadline, last, stable = time.monotonic() + timeout_s, None, 0
        while True:
            sizes = _sizes(self.staging)
            stable = stable + 1 if sizes == last else 0
            last = sizes
            found = sum(1 for n in sizes if _is_trace(n) and not _is_frontend(n))
            if found >= workers and stable >= STABLE_POLLS:
                return
            if time.monotonic() >= deadline:
                what = (f"{found} of {workers} worker traces" if found < workers
                        else "trace files still growing")  # fmt: skip
                self.warnings.append(f"{what} after {timeout_s:g} s of waiting: "
                                     "the traces may be incomplete")  # fmt: skip
                return
            await asyncio.sleep(POLL_S)

    # ---- after the server stopped --------------------------------------------------------
    def collect(self, command: list[str] | None, clock: dict) -> None:
        """Move the traces into the run and import them; problems become warnings."""
        if self.staging is None:
            return
        try:
            self._collect(command, clock)
        except Exception as e:  # whatever goes wrong here, the client's run is whole
            self.warnings.append(f"the traces were not all taken in ({type(e).__name__}: {e})")

    def _collect(self, command: list[str] | None, clock: dict) -> None:
        dest = self.run_dir / PROFILE_DIR
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(self.staging), dest)
        except OSError as e:
            self.warnings.append(f"the traces stay in {self.staging}: cannot move them into "
                                 f"the run ({e.strerror or e})")  # fmt: skip
            dest = self.staging
        else:
            self.dir = PROFILE_DIR
            with contextlib.suppress(OSError):
                dest.chmod(0o755)  # mkdtemp's folder is the owner's only; the run's is not
        self.staging = None
        for p in list(dest.iterdir()):
            if p.is_file() and p.name.endswith(".json") and _is_trace(p.name):
                self._compress(p)
        self.files = sorted(p.name for p in dest.iterdir() if p.is_file())
        traces = [n for n in self.files if _is_trace(n)]
        workers = [dest / n for n in traces if not _is_frontend(n)]
        frontend = [dest / n for n in traces if _is_frontend(n)]
        if self.profiled and not workers:
            self.warnings.append("vLLM wrote no worker trace")
        if workers and self._import(workers, TRACE_RUN, command, _ranks(workers)):
            self.trace_run = TRACE_RUN
        if frontend and self._import(frontend, FRONTEND_RUN, command, None):
            self.frontend_run = FRONTEND_RUN
        if self.trace_run is not None:
            self.alignment = self._align(clock)

    def _compress(self, path: Path) -> None:
        """`path` gzipped beside it (written whole, then renamed) in place of it."""
        from isal import igzip

        gz = path.with_name(path.name + ".gz")
        part = path.with_name(f".{gz.name}.part")
        try:
            with open(path, "rb") as src, igzip.open(part, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            part.replace(gz)
            path.unlink()
        except OSError as e:
            part.unlink(missing_ok=True)
            self.warnings.append(f"{path.name}: kept uncompressed ({e.strerror or e})")

    def _import(self, paths: list[Path], where: str, command, ranks) -> bool:
        from ..traces.importers.kineto import import_kineto

        try:
            summary = import_kineto([str(p) for p in paths], self.run_dir / where,
                                    command=command, ranks=ranks)  # fmt: skip
        except Exception as e:  # a failed import leaves the raw traces
            self.warnings.append(f"{where}: not imported ({type(e).__name__}: {e})")
            return False
        self.warnings.extend(f"{where}: {w}" for w in summary.warnings)
        return True

    def _align(self, clock: dict) -> dict:
        """The offset that puts the trace on the run's clock (`run_ns = trace_ns + offset`,
        from both manifests' wall-clock origins) and whether vLLM's step annotations fall
        inside the window the calls bracket (± the clocks' uncertainty)."""
        from ..traces.reader import load_run
        from ..traces.vllm_names import VLLM_STEP  # vLLM's step annotations

        run = load_run(self.run_dir / TRACE_RUN)
        tc = run.manifest.clock
        trace_wall0 = int(tc["wall_ns"]) - int(tc["monotonic_ns"])  # wall ns at trace ns 0
        offset = trace_wall0 - int(clock["wall_ns"]) + int(clock["monotonic_ns"])
        uncertainty = int(clock.get("uncertainty_ns") or 0) + int(tc.get("uncertainty_ns") or 0)
        out = {"trace_to_run_ns": offset, "uncertainty_ns": uncertainty, "steps": 0,
               "steps_ns": None, "trace_ns": None, "inside_window": None,
               "lead_ns": None, "trail_ns": None}  # fmt: skip
        extent = run.time_span_ns()
        if extent is not None:
            out["trace_ns"] = [extent[0] + offset, extent[1] + offset]
        spans = run.arrow("spans", ["name", "start_ns", "dur_ns"]).to_pandas()
        steps = spans[spans["name"].astype(str).str.match(VLLM_STEP)]
        window = self.window_ns()
        if len(steps):
            first = int(steps["start_ns"].min()) + offset
            last = int((steps["start_ns"] + steps["dur_ns"]).max()) + offset
            out.update(steps=len(steps), steps_ns=[first, last])
            if window is not None:
                lead, trail = first - window[0], window[1] - last
                out.update(lead_ns=lead, trail_ns=trail,
                           inside_window=bool(min(lead, trail) >= -uncertainty))  # fmt: skip
                if not out["inside_window"]:
                    self.warnings.append(
                        f"vLLM's steps fall {-min(lead, trail) / 1e6:.3f} ms outside the "
                        "profile window: the clocks disagree"
                    )
        return out

    def window_ns(self) -> list[int] | None:
        """[/start_profile sent, /stop_profile answered] on the run's monotonic clock:
        everything the profiler recorded lies inside."""
        start, stop = self.calls.get("/start_profile"), self.calls.get("/stop_profile")
        if not self.profiled or stop is None or stop.answered_ns is None:
            return None
        return [start.sent_ns, stop.answered_ns]

    def record(self) -> dict:
        """The manifest's `config.server.profile`."""
        window = self.window_ns()
        start, stop = self.calls.get("/start_profile"), self.calls.get("/stop_profile")
        return {
            "window_s": [self.spec.start_s, self.spec.end_s],
            "workload_start_ns": self.workload_start_ns,
            "window_ns": window,
            "wall_ns": None if window is None else [start.sent_wall_ns, stop.answered_wall_ns],
            "calls": {c.path: _call_record(c) for c in self.calls.values()},
            "launch_flag": list(self.flag),
            "dir": self.dir,
            "files": list(self.files),
            "trace_run": self.trace_run,
            "frontend_run": self.frontend_run,
            "alignment": self.alignment,
            "warnings": list(self.warnings),
        }

    def discard(self) -> None:
        """Remove the staging folder of a run that never collected it."""
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging = None


def _call_record(c: Call) -> dict:
    return {"sent_ns": c.sent_ns, "answered_ns": c.answered_ns, "status": c.status,
            "error": c.error}  # fmt: skip


def expected_workers(argv: list[str]) -> int:
    """The worker traces a window writes: one per tensor- × pipeline-parallel rank."""
    args = parse_server_args(argv)

    def size(*names: str) -> int:
        for name in names:
            value = args.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return 1

    return size("tensor_parallel_size", "tp") * size("pipeline_parallel_size", "pp")


def _ranks(paths: list[Path]) -> list[int] | None:
    """Each worker's global rank from its file name (`…_rank1.{ns}.pt.trace.json.gz`);
    None unless every name says one (the importer then reads distributedInfo)."""
    found = [WORKER_RANK.search(p.name) for p in paths]
    if len(paths) < 2 or not all(found):
        return None
    ranks = [int(m.group(1)) for m in found]
    return ranks if len(set(ranks)) == len(ranks) else None


def _is_trace(name: str) -> bool:
    return name.endswith(TRACE_SUFFIXES)


def _is_frontend(name: str) -> bool:
    """AsyncLLM's CPU trace: `{host}_{pid}.async_llm.{ns}.pt.trace.json.gz`."""
    return ".async_llm." in name


def _sizes(folder: Path) -> dict[str, int]:
    out = {}
    with contextlib.suppress(OSError):
        for p in folder.iterdir():
            with contextlib.suppress(OSError):
                if p.is_file():
                    out[p.name] = p.stat().st_size
    return out
