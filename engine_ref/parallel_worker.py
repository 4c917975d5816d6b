"""A tensor-parallel worker process (ranks 1…N-1): `python -m
perfdiag.engine_ref.parallel_worker PORT`, the authkey on stdin. It connects back to rank
0 (parallel.TensorParallel), builds and shards the model, answers the clock ping-pongs,
then runs each broadcast step plan on its shard and sends its timings back."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import resource
import signal
import sys
import time
import traceback
from datetime import timedelta

import torch

from .hooks import CollectiveEvent, RankStepEvent
from .kv_cache import KVCache
from .model_runner import ModelRunner
from .parallel import PING_ROUNDS, START_TIMEOUT_S, _apply_swaps, _threads_per_rank
from .parallel_shard import TPComm, local_model_config, shard_model


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:  # rank 0 died before the call above
        os._exit(1)


def _involuntary_switches() -> int:
    """How often the kernel has taken a core from this process (host contention)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


def worker_main(port: int) -> None:
    """A worker process: `python -m perfdiag.engine_ref.parallel_worker PORT`, authkey on stdin."""
    from multiprocessing.connection import Client

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # rank 0 handles Ctrl-C and stops us
    key = bytes.fromhex(sys.stdin.readline().strip())
    conn = Client(("127.0.0.1", port), authkey=key)
    rank, tp, dist_port, config, parent_pid = conn.recv()
    _die_with_parent(parent_pid)
    try:
        _worker(rank, tp, dist_port, config, conn)
    except BaseException:  # reported to rank 0, then exit non-zero
        with contextlib.suppress(Exception):
            last = traceback.format_exc().strip().splitlines()[-1]
            conn.send(f"tensor-parallel rank {rank} failed: {last}")
        os._exit(1)
    conn.send("done")
    conn.close()


def _worker(rank, tp, port, config, conn) -> None:
    import torch.distributed as dist

    from .engine_build import build_model, local_kv_blocks

    torch.set_num_threads(_threads_per_rank(tp))
    device = torch.device(config.device)
    if device.type == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        config = dataclasses.replace(config, device=str(device))
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=tp, timeout=timedelta(seconds=START_TIMEOUT_S))  # fmt: skip
    objects = dist.new_group(backend="gloo") if backend != "gloo" else dist.group.WORLD
    buf = torch.zeros(1, dtype=torch.int64)
    for _ in range(PING_ROUNDS):
        dist.recv(buf, src=0, group=objects)
        dist.send(torch.tensor([time.monotonic_ns()]), dst=0, group=objects)
    dist.recv(buf, src=0, group=objects)
    offset = int(buf.item())
    comm = TPComm(dist.group.WORLD, rank, tp)
    model = build_model(config)
    shard_model(model, rank, tp, comm, config.expert_placement)
    local_cfg = local_model_config(config.model, tp)
    num_blocks, num_cpu = local_kv_blocks(config)
    kv = KVCache(local_cfg, num_blocks, config.cache.block_size, num_cpu, device, config.dtype,
                 config.cache.kv_dtype)  # fmt: skip
    runner = ModelRunner(model, kv, config.cache.block_size, sampler=None)
    while True:
        msg = [None]
        dist.broadcast_object_list(msg, src=0, group=objects)
        if msg[0] is None:
            break
        step_id, plan, swaps = msg[0]
        t0, cpu0, sw0 = time.monotonic_ns(), time.process_time_ns(), _involuntary_switches()
        _apply_swaps(kv, swaps)
        inp = runner.build(plan)
        with torch.inference_mode():
            model(inp.input_ids, inp.positions, kv.layers, inp.meta)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t1, cpu1, sw1 = time.monotonic_ns(), time.process_time_ns(), _involuntary_switches()
        colls = [CollectiveEvent(rank, step_id, n, "tp", b, s - offset, e - offset, i, c)
                 for i, (n, b, s, e, c) in enumerate(comm.take())]  # fmt: skip
        conn.send((colls, [RankStepEvent(rank, step_id, t0 - offset, t1 - offset, cpu1 - cpu0,
                                         sw1 - sw0)]))  # fmt: skip
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


if __name__ == "__main__":
    worker_main(int(sys.argv[1]))
