"""A pipeline stage process (ranks 1…N-1): `python -m perfdiag.engine_ref.pipeline_worker
PORT`, the authkey on stdin. Started like a tensor-parallel worker (parallel_worker.py:
connection back to rank 0, clock ping-pongs); it keeps its stage's layers and their KV
pool, then for each broadcast step: every micro-batch received from the previous stage,
run through its layers, sent on (the last stage sends the sampling rows' hidden states to
rank 0), and its StageEvents sent back to rank 0."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import time
import traceback
from datetime import timedelta

import torch

from .hooks import StageEvent
from .kv_cache import KVCache
from .model_runner import ModelRunner
from .parallel import PING_ROUNDS, START_TIMEOUT_S, _apply_swaps, _threads_per_rank
from .parallel_worker import _die_with_parent
from .pipeline_split import keep_stage, stage_forward, stage_layers, stage_model_config


def worker_main(port: int) -> None:
    from multiprocessing.connection import Client

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # rank 0 handles Ctrl-C and stops us
    key = bytes.fromhex(sys.stdin.readline().strip())
    conn = Client(("127.0.0.1", port), authkey=key)
    rank, world, dist_port, config, parent_pid = conn.recv()
    _die_with_parent(parent_pid)
    try:
        _worker(rank, world, dist_port, config, conn)
    except BaseException:  # reported to rank 0, then exit non-zero
        with contextlib.suppress(Exception):
            last = traceback.format_exc().strip().splitlines()[-1]
            conn.send(f"pipeline stage {rank} failed: {last}")
        import os

        os._exit(1)
    conn.send("done")
    conn.close()


def _connect(rank: int, world: int, port: int, config):
    """The process group, the clock offset to rank 0, and this rank's device and config."""
    import torch.distributed as dist

    torch.set_num_threads(_threads_per_rank(world))
    device = torch.device(config.device)
    if device.type == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        config = dataclasses.replace(config, device=str(device))
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = timedelta(seconds=START_TIMEOUT_S)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timeout)  # fmt: skip
    objects = dist.new_group(backend="gloo") if backend != "gloo" else dist.group.WORLD
    buf = torch.zeros(1, dtype=torch.int64)
    for _ in range(PING_ROUNDS):
        dist.recv(buf, src=0, group=objects)
        dist.send(torch.tensor([time.monotonic_ns()]), dst=0, group=objects)
    dist.recv(buf, src=0, group=objects)
    return objects, int(buf.item()), device, config


def _worker(rank, world, port, config, conn) -> None:
    import torch.distributed as dist

    from .engine_build import build_model, local_kv_blocks

    objects, offset, device, config = _connect(rank, world, port, config)
    layers = stage_layers(config.model.num_layers, world, config.pipeline_layers)[rank]
    model = build_model(config)
    keep_stage(model, layers)
    num_blocks, num_cpu = local_kv_blocks(config)
    kv = KVCache(stage_model_config(config.model, layers), num_blocks, config.cache.block_size,
                 num_cpu, device, config.dtype, config.cache.kv_dtype)  # fmt: skip
    runner = ModelRunner(model, kv, config.cache.block_size, sampler=None)
    last = rank == world - 1
    dst = 0 if last else rank + 1
    dtype, hidden = model.norm.weight.dtype, config.model.hidden_size
    while True:
        msg = [None]
        dist.broadcast_object_list(msg, src=0, group=objects)
        if msg[0] is None:
            break
        step_id, (plans, all_logits), swaps = msg[0]
        _apply_swaps(kv, swaps)
        events, sends = [], []
        for i, plan in enumerate(plans):
            mb = runner.build(plan)
            n = len(plan.ids)
            buf = torch.empty(n, hidden, dtype=dtype, device=device)
            t0 = time.monotonic_ns()
            dist.recv(buf, src=rank - 1)
            t1 = time.monotonic_ns()
            x = stage_forward(model, buf, mb.positions, kv.layers, mb.meta, False, last)
            if last and not all_logits:
                x = x[mb.sample_idx]
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t2 = time.monotonic_ns()
            events.append(StageEvent(rank, step_id, i, "recv", t0 - offset, t1 - offset,
                                     buf.numel() * buf.element_size(), n))  # fmt: skip
            events.append(StageEvent(rank, step_id, i, "compute", t1 - offset, t2 - offset, 0, n))
            if x.shape[0]:
                x = x.contiguous()
                sends.append((x, dist.isend(x, dst=dst)))
                t3 = time.monotonic_ns()
                events.append(StageEvent(rank, step_id, i, "send", t2 - offset, t3 - offset,
                                         x.numel() * x.element_size(), n))  # fmt: skip
        for _, work in sends:
            work.wait()
        conn.send(([], [], events))
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


if __name__ == "__main__":
    worker_main(int(sys.argv[1]))
