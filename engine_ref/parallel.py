"""Tensor parallelism over torch.distributed: one process per rank, rank 0 schedules.

`EngineConfig(tensor_parallel_size=N)` makes the engine (rank 0, this process) spawn N-1
worker processes. They meet over a TCP store on 127.0.0.1 (gloo on the CPU, NCCL on CUDA
for the model's all-reduces; plans always go over a gloo group). Every rank builds the full
model, then keeps its shard (parallel_shard.py's `shard_model`, Megatron's split):

- column-parallel: the fused q/k/v rows of its query and KV heads (num_heads / N and
  num_kv_heads / N each), the gate and up rows of its intermediate columns;
- row-parallel: the matching input columns of o_proj and down_proj, whose partial outputs
  are summed by an all_reduce (after attention, after the MLP: 2 per layer per step);
- replicated: embeddings, norms, the lm_head. Only rank 0 computes logits and samples
  (full logits, no all-gather: the head is small next to the layers, and sampling stays
  exactly the single-process code);
- a mixture-of-experts MLP (moe.py) is expert-parallel instead (`shard_moe`): E/N
  contiguous experts per rank, the router replicated (every rank routes every token),
  the shared expert column/row-split; the MLP's all_reduce combines the partial outputs.

Each rank's KV cache holds its KV heads for every block; the block manager, the
scheduler and the sampler live on rank 0 only. Each step rank 0 broadcasts the step's
plan (`model_runner.StepPlan`: token ids, positions, slot mapping, block tables, and the
swap copies the scheduler made) and every rank runs the forward on its shard.

Capture: every rank times its collectives (host clock around the call: on CUDA, NCCL's
launch, not its completion) and its forward; workers convert their timestamps to rank 0's
clock with the offset measured by ping-pongs at start (`ClockSync`: offset and its
uncertainty, half the best round trip) and send them to rank 0 over a queue; the engine
hands them to its observer (`on_collectives`, `on_rank_steps`).

Shutdown: `close()` sends a stop plan and joins; a worker that fails reports its error and
exits (rank 0's next collective then fails too and the engine raises it); workers ignore
SIGINT (rank 0 handles Ctrl-C and stops them) and die with rank 0 (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from datetime import timedelta
from typing import NamedTuple

import torch

from ..errors import ConfigError
from .hooks import CollectiveEvent, RankStepEvent
from .kv_cache import KVCache
from .model_runner import ModelInput, ModelRunner, StepPlan
from .moe import placement
from .parallel_shard import TPComm

# The best round trip bounds the clock offset: more rounds, a tighter bound on a busy host.
PING_ROUNDS = 32
START_TIMEOUT_S = 120.0


class ClockSync(NamedTuple):
    rank: int
    offset_ns: int  # worker clock − rank 0's clock
    uncertainty_ns: int  # half the best round trip


class TPKVCache(KVCache):
    """Rank 0's cache: records the swap copies the scheduler makes, for the workers."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.pending: list[tuple[str, list[int], list[int]]] = []

    def swap_out(self, device_blocks, cpu_blocks) -> None:
        self.pending.append(("out", list(device_blocks), list(cpu_blocks)))
        super().swap_out(device_blocks, cpu_blocks)

    def swap_in(self, cpu_blocks, device_blocks) -> None:
        self.pending.append(("in", list(cpu_blocks), list(device_blocks)))
        super().swap_in(cpu_blocks, device_blocks)


def _apply_swaps(kv: KVCache, swaps) -> None:
    for kind, a, b in swaps:
        (kv.swap_out if kind == "out" else kv.swap_in)(a, b)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _threads_per_rank(tp: int) -> int:
    return max(1, (os.cpu_count() or 1) // tp)


class TensorParallel:
    """Rank 0's side: the workers, the groups, the plan broadcast and the records.

    Workers are `python -m perfdiag.engine_ref.parallel_worker` subprocesses (not multiprocessing's
    spawn, which re-imports the parent's __main__): each connects back to a local
    `multiprocessing.connection` listener (random authkey), receives its rank and the
    config there, and sends its records and its error, if any, on that connection.
    Pipeline parallelism (pipeline.py) reuses all of this with its own worker module."""

    worker_module = "perfdiag.engine_ref.parallel_worker"
    label = "tensor-parallel"

    def _world_size(self, config) -> int:
        return config.tensor_parallel_size

    def __init__(self, config) -> None:
        import subprocess
        from multiprocessing.connection import Listener

        import torch.distributed as dist

        self.dist = dist
        self.tp = tp = self._world_size(config)
        self.model_config = config.model
        self.expert_placement = config.expert_placement
        if dist.is_initialized():
            raise ConfigError(f"a {self.label} engine is already running in this process")
        self.device = torch.device(config.device)
        self.backend = backend = "nccl" if self.device.type == "cuda" else "gloo"
        port = _free_port()
        key = os.urandom(16)
        self.procs: list[subprocess.Popen] = []
        self.conns: list = []
        self._closed = False
        self._in_step = False
        self._done = 0
        self._error: str | None = None
        self._threads = torch.get_num_threads()
        self.step_id = -1
        try:
            with Listener(("127.0.0.1", 0), authkey=key) as listener:
                for _ in range(1, tp):
                    self.procs.append(subprocess.Popen(
                        [sys.executable, "-m", self.worker_module,
                         str(listener.address[1])],
                        stdin=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                    ))  # fmt: skip
                    self.procs[-1].stdin.write(key.hex().encode() + b"\n")
                    self.procs[-1].stdin.close()
                for rank in range(1, tp):
                    conn = _accept(listener, self.procs)
                    conn.send((rank, tp, port, config, os.getpid()))
                    self.conns.append(conn)
            torch.set_num_threads(_threads_per_rank(tp))
            dist.init_process_group(
                backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=tp,
                timeout=timedelta(seconds=START_TIMEOUT_S),
            )  # fmt: skip
            self.model_group = dist.group.WORLD
            self.cpu_group = dist.new_group(backend="gloo") if backend != "gloo" else None
            self.clocks = [ClockSync(0, 0, 0), *self._sync_clocks()]
        except BaseException:
            self._kill()
            raise
        self.comm = TPComm(self.model_group, 0, tp)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def _sync_clocks(self) -> list[ClockSync]:
        dist, out = self.dist, []
        buf = torch.zeros(1, dtype=torch.int64)
        for rank in range(1, self.tp):
            best = None
            for _ in range(PING_ROUNDS):
                t0 = time.monotonic_ns()
                dist.send(torch.tensor([t0]), dst=rank, group=self._objects)
                dist.recv(buf, src=rank, group=self._objects)
                t1 = time.monotonic_ns()
                sample = (t1 - t0, int(buf.item()) - (t0 + t1) // 2)
                best = sample if best is None or sample[0] < best[0] else best
            dist.send(torch.tensor([best[1]]), dst=rank, group=self._objects)
            out.append(ClockSync(rank, best[1], best[0] // 2))
        return out

    @property
    def _objects(self):
        return getattr(self, "cpu_group", None) or self.dist.group.WORLD

    def info(self) -> dict:
        return {
            "tensor_parallel_size": self.tp,
            "backend": self.backend,
            "world_size": self.tp,
            "lm_head": "replicated; rank 0 samples from full logits",
            "clock_sync": [c._asdict() for c in self.clocks],
            "collective_timing": "host clock around each call",
            **self._expert_info(),
        }

    def _expert_info(self) -> dict:
        """Mixture of experts: where each expert lives (expert parallelism over the same
        ranks) and how the shared expert is split; {} for a dense model."""
        m = self.model_config
        if not m.is_moe:
            return {}
        return {
            "expert_parallel_size": self.tp,
            "expert_placement": placement(m.num_experts, self.tp, self.expert_placement),
            "expert_dispatch": "gather/scatter: every rank routes every token, computes "
            "its own experts; the MLP's all_reduce combines",
            "shared_expert": "column/row-parallel across ranks" if
            m.shared_expert_intermediate_size else "none",
        }  # fmt: skip

    # ---- a step ------------------------------------------------------------------------------
    def send_plan(self, step_id: int, plan: StepPlan, swaps: list) -> None:
        self._in_step = True
        self.step_id = step_id
        self._check_workers()
        self.dist.broadcast_object_list([(step_id, plan, swaps)], src=0, group=self._objects)

    def step_done(self) -> None:
        self._in_step = False

    def take_records(self) -> tuple[list[CollectiveEvent], list[RankStepEvent]]:
        """Rank 0's collectives of the last step and every worker batch that has arrived."""
        colls = [CollectiveEvent(0, self.step_id, n, "tp", b, s, e, i, c)
                 for i, (n, b, s, e, c) in enumerate(self.comm.take())]  # fmt: skip
        steps: list[RankStepEvent] = []
        for conn in self.conns:
            while True:
                try:
                    if not conn.poll():
                        break
                    msg = conn.recv()
                except (EOFError, OSError):
                    break
                if msg == "done":
                    self._done += 1
                elif isinstance(msg, str):  # the worker's error
                    self._error = self._error or msg
                else:
                    colls.extend(msg[0])
                    steps.extend(msg[1])
                    self._more_records(msg[2:])
        return colls, steps

    def _more_records(self, extra: tuple) -> None:
        """A worker message's records past its collectives and forwards (pipeline.py)."""

    def runner_class(self):
        return TPModelRunner

    def _check_workers(self) -> None:
        for rank, p in enumerate(self.procs, 1):
            if p.poll() is not None:
                raise RuntimeError(self._worker_error(
                    f"{self.label} rank {rank} exited (code {p.returncode})"))  # fmt: skip

    def _worker_error(self, default: str) -> str:
        deadline = time.monotonic() + 2.0
        while self._error is None and time.monotonic() < deadline:
            self.take_records()
            if self._error is None:
                time.sleep(0.02)
        return self._error or default

    def failed(self, exc: BaseException) -> RuntimeError:
        """A collective failed on rank 0: the workers' own error when one reported, else
        which worker exited, else the collective's error."""
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and self._error is None:
            dead = [(r, p.returncode) for r, p in enumerate(self.procs, 1) if p.poll() is not None]
            if dead:
                r, code = dead[0]
                return RuntimeError(f"{self.label} rank {r} exited (code {code}): {exc}")
            self.take_records()
            time.sleep(0.02)
        return RuntimeError(self._error or f"{self.label} engine failed: {exc}")

    # ---- shutdown ----------------------------------------------------------------------------
    def close(self, observer=None) -> None:
        """Stop the workers: a stop plan when they are between steps, else (a step was
        interrupted, or a worker is gone) terminate them. Never leaves one running."""
        if self._closed:
            return
        self._closed = True
        graceful = not self._in_step and all(p.poll() is None for p in self.procs)
        if graceful:
            try:
                self.dist.broadcast_object_list([None], src=0, group=self._objects)
            except Exception:  # a worker died meanwhile: kill the rest
                graceful = False
        deadline = time.monotonic() + 10.0
        while graceful and self._done < len(self.procs) and time.monotonic() < deadline:
            c, s = self.take_records()
            if observer is not None and (c or s):
                observer.on_collectives(c)
                observer.on_rank_steps(s)
            if self._done < len(self.procs):
                time.sleep(0.005)
        if graceful:
            for p in self.procs:
                with contextlib.suppress(Exception):
                    p.wait(max(0.1, deadline - time.monotonic()))
        self._kill()
        with contextlib.suppress(Exception):
            self.dist.destroy_process_group()
        torch.set_num_threads(self._threads)

    def _kill(self) -> None:
        import subprocess

        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(5.0)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5.0)
        for c in self.conns:
            with contextlib.suppress(Exception):
                c.close()


def _accept(listener, procs):
    """The next worker's connection; fails if a worker exits before connecting."""
    from multiprocessing.connection import wait

    sock = listener._listener._socket
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if wait([sock], timeout=0.1):
            return listener.accept()
        for rank, p in enumerate(procs, 1):
            if p.poll() is not None:
                raise RuntimeError(f"tensor-parallel rank {rank} exited at start "
                                   f"(code {p.returncode})")  # fmt: skip
    raise RuntimeError(f"tensor-parallel workers did not start within {START_TIMEOUT_S:.0f} s")


class TPModelRunner(ModelRunner):
    """Rank 0's runner: broadcasts each step's plan before its own forward."""

    def __init__(self, *a, tp: TensorParallel, **kw) -> None:
        super().__init__(*a, **kw)
        self.tp = tp
        self.step_id = 0

    def forward(self, inp: ModelInput, all_logits: bool = False) -> torch.Tensor:
        swaps, self.kv_cache.pending = self.kv_cache.pending, []
        try:
            self.tp.send_plan(self.step_id, inp.plan, swaps)
            self.step_id += 1
            out = super().forward(inp, all_logits)
        except RuntimeError as e:
            raise self.tp.failed(e) from e
        self.tp.step_done()
        return out
