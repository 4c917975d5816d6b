"""Kernel micro-benchmarks on CUDA: achieved GB/s and FLOP/s of each kernel against the
machine's measured ceilings (`perfdiag calibrate`), and decode-step time with and without
CUDA graphs. Used by scripts/gpu_check.sh:

    python -m perfdiag.engine_ref.kernels.bench --json out.json [--ceilings-dir DIR]

Shapes are a Llama-3-8B layer's (hidden 4096, 32 query / 8 KV heads of 128, MLP 14336)
in bf16: small launches are latency bound by nature, so each case is sized to show the
kernel's own limit. FLOPs and bytes are the kernels' cost models, the probe's figures.
Times are `triton.testing.do_bench` medians (L2 flushed between runs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass

import torch
import triton.testing

from ..quant import PackedWeight, quantize
from . import decode_attention as dec
from . import dequant_matmul as dqm
from . import kv_store, rms_norm, rope, silu_mul
from . import prefill_attention as pre
from ._common import elem_bytes
from .testing import paged_cache, scattered_tables


@dataclass(frozen=True)
class Shapes:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    block_size: int
    tokens: int  # rows of the elementwise kernels
    decodes: tuple[tuple[int, int], ...]  # (batch, context) of decode attention
    prefill: tuple[int, int, int]  # (sequences, new tokens, cached tokens)


LLAMA_8B = Shapes(4096, 32, 8, 128, 14336, 16, 4096, ((64, 4096), (8, 16384), (1, 8192)),
                  (4, 2048, 1024))  # fmt: skip
TINY = Shapes(64, 6, 2, 24, 96, 4, 8, ((3, 9),), (2, 5, 3))  # the CPU smoke test's


def _cases(dev, dt, shapes: Shapes, num_sms: int) -> list[tuple]:
    """(name, shape text, fn, flops, bytes) per case; inputs built once."""
    e, out = elem_bytes(dt), []
    HID, HQ, HKV, D = shapes.hidden, shapes.heads, shapes.kv_heads, shapes.head_dim
    INTER, BS = shapes.inter, shapes.block_size

    def add(name, shape, fn, flops, nbytes):
        out.append((name, shape, fn, flops, nbytes))

    t = shapes.tokens
    x = torch.randn(t, HID, device=dev, dtype=dt)
    w, r = torch.randn(HID, device=dev, dtype=dt), torch.randn(t, HID, device=dev, dtype=dt)
    add("rms_norm+residual", f"T={t} H={HID}", lambda: rms_norm.rms_norm(x, w, 1e-6, r),
        rms_norm.flops(t, HID, True), rms_norm.bytes_moved(t, HID, e, True))  # fmt: skip
    qkv = torch.randn(t, (HQ + 2 * HKV) * D, device=dev, dtype=dt)
    qk = qkv[:, : (HQ + HKV) * D].view(t, HQ + HKV, D)
    pos = torch.randint(0, 512, (t,), device=dev)
    cos = torch.randn(512, D, device=dev, dtype=dt)
    add("rope", f"T={t} heads={HQ + HKV} D={D}", lambda: rope.rope_(qk, pos, cos, cos),
        rope.flops(t, HQ + HKV, D), rope.bytes_moved(t, HQ + HKV, D, e, e))  # fmt: skip
    gu = torch.randn(t, 2 * INTER, device=dev, dtype=dt)
    add("silu_mul", f"T={t} I={INTER}", lambda: silu_mul.silu_mul(gu),
        silu_mul.flops(t, INTER), silu_mul.bytes_moved(t, INTER, e))  # fmt: skip
    kc, vc = paged_cache(t // BS + 8, BS, HKV, D, dt, dev)
    k = qkv[:, HQ * D : (HQ + HKV) * D].view(t, HKV, D)
    v = qkv[:, (HQ + HKV) * D :].view(t, HKV, D)
    slots = torch.randperm(kc.shape[0] * BS, device=dev)[:t]
    add("kv_store", f"T={t} Hkv={HKV} D={D}", lambda: kv_store.store_kv(k, v, kc, vc, slots),
        0, kv_store.bytes_moved(t, HKV, D, e))  # fmt: skip
    for batch, ctx in shapes.decodes:
        blocks = batch * ctx // BS + 16
        kc, vc = paged_cache(blocks, BS, HKV, D, dt, dev, seed=1)
        tables = scattered_tables([ctx] * batch, BS, blocks).to(dev)
        lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
        q = torch.randn(batch, HQ, D, device=dev, dtype=dt)
        s, total = dec.choose_num_splits(batch, HKV, ctx, num_sms), batch * ctx
        nbytes = dec.bytes_moved(batch, HQ, HKV, D, total, e, tables.shape[1], s)
        nbytes += dec.combine_bytes(batch, HQ, D, s, e) if s > 1 else 0

        def run(q=q, kc=kc, vc=vc, tables=tables, lens=lens, s=s, total=total):
            dec.decode_attention(q, kc, vc, tables, lens, D**-0.5, s, total)

        add(f"decode_attention splits={s}", f"B={batch} ctx={ctx} GQA {HQ}:{HKV}", run,
            dec.flops(total, HQ, D), nbytes)  # fmt: skip
    seqs, new, cached = shapes.prefill
    ctx = new + cached
    blocks = seqs * ctx // BS + 16
    kc, vc = paged_cache(blocks, BS, HKV, D, dt, dev, seed=2)
    tables = scattered_tables([ctx] * seqs, BS, blocks).to(dev)
    cu = torch.arange(0, (seqs + 1) * new, new, dtype=torch.int32, device=dev)
    lens = torch.full((seqs,), ctx, dtype=torch.int32, device=dev)
    q = torch.randn(seqs * new, HQ, D, device=dev, dtype=dt)
    pairs = pre.causal_pairs([new] * seqs, [ctx] * seqs)

    def prefill():
        pre.prefill_attention(q, kc, vc, tables, cu, lens, D**-0.5, new, pairs, seqs * ctx)

    nbytes = pre.bytes_moved(seqs * new, HQ, HKV, D, seqs * ctx, seqs, e, tables.shape[1])
    add("prefill_attention", f"{seqs}×{new} new after {cached} cached", prefill,
        pre.flops(pairs, HQ, D), nbytes)  # fmt: skip
    _matmul_cases(add, dev, dt, shapes)
    return out


def _matmul_cases(add, dev, dt, shapes: Shapes) -> None:
    """The MLP's up projection (N = I, K = H) at one row (decode: the weight's bytes are
    the time) and at `tokens` rows (prefill: it pays the dequantisation per row tile),
    packed Q4_1 / Q8_0 through the dequant kernel against the dense GEMM (cuBLAS)."""
    n, k, e = shapes.inter, shapes.hidden, elem_bytes(dt)
    dense = torch.randn(n, k, device=dev, dtype=dt)
    packed = {}
    for fmt in ("q4_1", "q8_0"):
        p = quantize(dense, fmt)
        moved = [None if t is None else t.to(dev) for t in (p.qs, p.d, p.m)]
        packed[fmt] = PackedWeight(fmt, n, k, *moved)
    for m in (1, shapes.tokens):
        x = torch.randn(m, k, device=dev, dtype=dt)
        add("dense_matmul", f"M={m} N={n} K={k}", lambda x=x: x @ dense.T,
            2 * m * n * k, (n * k + m * k + m * n) * e)  # fmt: skip
        block_m = dqm.row_tile(m)  # the dequantisation is paid once per row tile
        for fmt, w in packed.items():
            add(f"dequant_matmul {fmt}", f"M={m} N={n} K={k}",
                lambda x=x, w=w: dqm.dequant_matmul(x, w), dqm.flops(m, n, k, block_m),
                dqm.bytes_moved(m, n, k, fmt, e))  # fmt: skip


def _host_time_ms(fn) -> float:
    fn()
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def bench_kernels(device="cuda", dtype="bfloat16", ceilings=None, shapes=LLAMA_8B) -> list[dict]:
    """One row per case: time, GB/s, TFLOP/s and, given ceilings, their percentages. On
    the CPU (the interpreter: a smoke test, not a measurement) one host-timed call."""
    dt, dev = getattr(torch, dtype), torch.device(device)
    cuda = dev.type == "cuda"
    sms = torch.cuda.get_device_properties(dev).multi_processor_count if cuda else 0
    rows = []
    for name, shape, fn, flops, nbytes in _cases(dev, dt, shapes, sms):
        ms = triton.testing.do_bench(fn, warmup=25, rep=100) if cuda else _host_time_ms(fn)
        row = {"kernel": name, "shape": shape, "ms": ms, "flops": flops, "bytes": nbytes,
               "gb_per_s": nbytes / ms / 1e6, "tflop_per_s": flops / ms / 1e9}  # fmt: skip
        if ceilings is not None:
            row["pct_of_bandwidth"] = 100 * nbytes / (ms / 1e3) / ceilings.bytes_per_s
            row["pct_of_peak_flops"] = 100 * flops / (ms / 1e3) / ceilings.peak_flops(dtype)
        rows.append(row)
    return rows


def bench_graphs(device="cuda", dtype="bfloat16", preset="small", steps=64) -> dict:
    """Mean decode-step time (host clock around `engine.step()`, which ends when the tokens
    reach the host) at batch 1, eager against CUDA graphs."""
    from ..config import EngineConfig, ModelConfig
    from ..engine import LLMEngine
    from ..request import SamplingParams

    out = {}
    for graphs in (False, True):
        cfg = EngineConfig(model=ModelConfig.preset(preset), device=device, dtype=dtype,
                           kernel_backend="triton", cuda_graphs=graphs,
                           cuda_graph_batch_sizes=(1, 2, 4, 8))  # fmt: skip
        engine = LLMEngine(cfg)
        engine.add_request(
            list(range(1, 33)),
            SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True),
        )
        times = []
        for i in range(steps + 8):
            t0 = time.perf_counter()
            engine.step()
            if i >= 8:  # past the prefill and the first decodes
                times.append(time.perf_counter() - t0)
        out["graph_ms" if graphs else "eager_ms"] = 1e3 * statistics.median(times)
        if graphs:
            out["graph_replays"] = engine.runner.graphs.replays
            out["capture_failed"] = engine.runner.graphs.failed
    out["speedup"] = out["eager_ms"] / out["graph_ms"]
    return out


def main(argv=None) -> None:
    from ...hardware.ceilings import resolve

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--ceilings-dir", default=None)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args(argv)
    ceilings = resolve(torch.cuda.get_device_name(0), args.ceilings_dir)
    rows = bench_kernels("cuda", args.dtype, ceilings)
    graphs = bench_graphs("cuda", args.dtype)
    result = {"device": torch.cuda.get_device_name(0), "dtype": args.dtype,
              "ceilings": ceilings.to_dict(), "kernels": rows, "cuda_graphs": graphs}  # fmt: skip
    for r in rows:
        bw, fl = r.get("pct_of_bandwidth", 0), r.get("pct_of_peak_flops", 0)
        head = f"{r['kernel']:<28} {r['shape']:<32} {r['ms'] * 1e3:9.1f} µs"
        tail = f"{r['tflop_per_s']:7.1f} TFLOP/s ({fl:5.1f}%)"
        print(f"{head} {r['gb_per_s']:8.0f} GB/s ({bw:5.1f}%) {tail}")
    print(
        f"decode step, batch 1: eager {graphs['eager_ms']:.3f} ms, CUDA graphs "
        f"{graphs['graph_ms']:.3f} ms, {graphs['speedup']:.2f}×  ({ceilings.kind} ceilings)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
