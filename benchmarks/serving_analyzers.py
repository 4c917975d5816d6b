"""Benchmark the serving analyzers on a synthetic run of 100k requests and 1M spans.

Target (issue 5): analysing it — every analysis `perfdiag analyze` runs — in under 10 s.
The run is built with numpy and written straight to Parquet (generation is not timed):
an engine admitting one request every other step, each request prefilled in one step
and decoding 7 more tokens in the next 7, so about four sequences share each step;
5 phase spans per step; a client that sends, waits, and sometimes receives two tokens
in one chunk. About 2.6M request events.

    .venv/bin/python benchmarks/serving_analyzers.py [--requests 100000]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from perfdiag import load_run
from perfdiag.analyzers.serving import analyze_serving, write_metrics
from perfdiag.analyzers.slo import Slo
from perfdiag.traces.environment import cpu_model, package_version
from perfdiag.traces.layout import parquet_path
from perfdiag.traces.schema import SCHEMAS
from perfdiag.traces.writer import RunWriter

T0 = 1_700_000_000_000_000_000
US = 1_000
STEP_NS, GAP_NS = 1_000 * US, 200 * US
TOKENS = 8  # output tokens per request
PHASES = ("schedule", "prepare_inputs", "forward", "sample", "post_process")
PHASE_SHARE = (0.05, 0.10, 0.70, 0.10, 0.05)


def machine() -> str:
    return (
        f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"numpy {package_version('numpy')}, pandas {package_version('pandas')}, "
        f"pyarrow {package_version('pyarrow')}"
    )


def build(path: Path, n: int, seed: int = 0) -> dict[str, int]:
    rng = np.random.default_rng(seed)
    n_steps = 2 * n + TOKENS
    k = np.arange(n_steps, dtype=np.int64)
    start = T0 + k * (STEP_NS + GAP_NS)
    end = start + STEP_NS
    bounds = np.concatenate(([0.0], np.cumsum(PHASE_SHARE)))
    post_start = start + int(bounds[4] * STEP_NS)

    # requests: i is admitted by step 2i and samples token j (1-based) in step 2i + j - 1
    i = np.arange(n, dtype=np.int64)
    adm = 2 * i
    queue = rng.integers(0, 3_000, n) * US
    sent = start[adm] - queue - 100 * US
    wait = rng.integers(0, 50, n) * US
    late = rng.integers(0, 500, n) * US
    tok_step = adm[:, None] + np.arange(TOKENS)[None, :]  # n × TOKENS
    tok_ts = post_start[tok_step]
    recv = end[tok_step] + 300 * US
    merged = rng.random(n) < 0.25  # the last two tokens arrive in one chunk
    rid = np.char.add("req-", i.astype(str)).astype(object)

    ev = _Events()
    ev.client(rid, "scheduled_send", sent - wait - late)
    ev.client(rid, "created", sent - wait)
    ev.client(rid, "sent", sent)
    ev.client(rid, "first_token", recv[:, 0])
    for j in range(TOKENS):
        keep = ~(merged & (j == TOKENS - 2))  # merged: token 7 rides with token 8
        tokens = np.where(merged & (j == TOKENS - 1), 2, 1)
        ev.client(rid[keep], "chunk", recv[keep, j], tokens=tokens[keep])
    ev.client(rid, "done", recv[:, -1] + 50 * US, tokens=np.full(n, TOKENS))
    ev.engine(rid, "arrival", sent + 20 * US, tokens=np.full(n, 64))
    ev.engine(rid, "tokenize_end", sent + 50 * US, tokens=np.full(n, 64))
    ev.engine(rid, "queued", sent + 60 * US, tokens=np.full(n, 64))
    cached = np.where(rng.random(n) < 0.3, 32, 0)
    ev.engine(
        rid, "scheduled", start[adm] + 50 * US, step=adm, tokens=np.full(n, 64), cached=cached
    )
    ev.engine(rid, "prefill_chunk", tok_ts[:, 0], step=adm, tokens=np.full(n, 64))
    ev.engine(rid, "first_token", tok_ts[:, 0], step=adm, tokens=np.ones(n, np.int64))
    for j in range(1, TOKENS):
        ev.engine(rid, "token", tok_ts[:, j], step=tok_step[:, j], tokens=np.full(n, j + 1))
    ev.engine(
        rid,
        "finished",
        tok_ts[:, -1],
        step=tok_step[:, -1],
        tokens=np.full(n, TOKENS),
        detail="length",
    )

    decode = np.zeros(n_steps, dtype=np.int64)
    np.add.at(decode, tok_step[:, 1:].ravel(), 1)
    prefill = np.zeros(n_steps, dtype=np.int64)
    prefill[adm] = 64
    steps = {
        "step_id": k,
        "start_ns": start,
        "end_ns": end,
        "num_prefill_seqs": (prefill > 0).astype(np.int64),
        "num_prefill_tokens": prefill,
        "num_decode_seqs": decode,
        "num_context_tokens": prefill + decode * 70,
        "num_waiting": rng.integers(0, 3, n_steps),
        "num_running": decode + (prefill > 0),
        "num_swapped": np.zeros(n_steps, np.int64),
        "num_preempted": np.zeros(n_steps, np.int64),
    }
    ph = np.repeat(k, len(PHASES))
    offs = np.tile((bounds[:-1] * STEP_NS).astype(np.int64), n_steps)
    durs = np.tile((np.array(PHASE_SHARE) * STEP_NS).astype(np.int64), n_steps)
    spans = {
        "name": np.tile(np.array(PHASES, dtype=object), n_steps),
        "category": "phase",
        "start_ns": start[ph] + offs,
        "dur_ns": durs,
        "pid": 1,
        "tid": 2,
        "step_id": ph,
    }
    requests = {
        "request_id": rid,
        "prompt_tokens": np.full(n, 64),
        "output_tokens": np.full(n, TOKENS),
        "cached_tokens": cached,
        "finish_reason": "length",
        "is_warmup": i < 100,
        "prefix_group": rng.integers(0, 16, n),
    }

    with RunWriter(path, command=["benchmark"], environment_info={"benchmark": True}):
        pass  # a complete, empty run: its tables are replaced below
    tables = {"requests": requests, "request_events": ev.columns(), "steps": steps, "spans": spans}
    for name, cols in tables.items():
        pq.write_table(_table(name, cols), parquet_path(path, name), compression="zstd")
    return {name: len(next(iter(_arrays(cols)))) for name, cols in tables.items()}


class _Events:
    def __init__(self) -> None:
        self.parts: list[dict] = []

    def client(self, rid, kind, ts, tokens=None) -> None:
        self._add(rid, kind, ts, "client", None, tokens, None, None)

    def engine(self, rid, kind, ts, step=None, tokens=None, cached=None, detail=None) -> None:
        self._add(rid, kind, ts, "engine", step, tokens, cached, detail)

    def _add(self, rid, kind, ts, side, step, tokens, cached, detail) -> None:
        n = len(rid)
        part = {
            "request_id": rid,
            "ts_ns": np.asarray(ts, np.int64),
            "step_id": step,
            "num_tokens": tokens,
            "detail": detail,
            "num_cached_tokens": cached,
            "_n": n,
            "kind": np.full(n, kind, dtype=object),
            "side": np.full(n, side, dtype=object),
        }
        self.parts.append(part)

    def columns(self) -> dict:
        out = {}
        for col in ("request_id", "kind", "ts_ns", "side"):
            out[col] = np.concatenate([p[col] for p in self.parts])
        for col in ("step_id", "num_tokens", "num_cached_tokens", "detail"):
            out[col] = pa.chunked_array([_nullable(p[col], p["_n"], col) for p in self.parts])
        return out


def _nullable(values, n: int, col: str) -> pa.Array:
    typ = pa.string() if col == "detail" else pa.int64()
    if values is None:
        return pa.nulls(n, typ)
    if isinstance(values, str):
        return pa.array([values] * n, typ)
    return pa.array(np.asarray(values, np.int64), typ)


def _arrays(cols: dict):
    return [v for v in cols.values() if not isinstance(v, str | int | float)]


def _table(name: str, cols: dict) -> pa.Table:
    schema = SCHEMAS[name]
    n = len(_arrays(cols)[0])
    arrays = []
    for field in schema:
        v = cols.get(field.name)
        if v is None:
            arrays.append(pa.nulls(n, field.type))
        elif isinstance(v, str | int | float) and not isinstance(v, bool):
            arrays.append(pa.array([v] * n, field.type))
        elif isinstance(v, pa.ChunkedArray):
            arrays.append(v.combine_chunks().cast(field.type))
        else:
            arrays.append(pa.array(v, field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    args = parser.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run"
        t = time.perf_counter()
        rows = build(path, args.requests)
        print(
            f"synthetic run built in {time.perf_counter() - t:.1f} s (not timed below): "
            + ", ".join(f"{name} {count:,}" for name, count in rows.items())
        )
        t = time.perf_counter()
        run = load_run(path)
        for name in ("requests", "request_events", "steps", "spans"):
            run.table(name)
        load_s = time.perf_counter() - t
        t = time.perf_counter()
        result = analyze_serving(run, Slo(ttft_s=0.5, tpot_s=0.05))
        total = time.perf_counter() - t
        t = time.perf_counter()
        write_metrics(result, path)
        write_s = time.perf_counter() - t
    print(f"load_run + DataFrames: {load_s:.2f} s (not part of the target)")
    for timing in result.timings:
        print(f"  {timing.analysis:<18} {timing.seconds:7.3f} s")
    verdict = "met" if total < 10 else "MISSED"
    print(f"analyze_serving total: {total:.2f} s   target < 10 s: {verdict}")
    print(f"with loading and writing metrics.json: {load_s + total + write_s:.2f} s")
    m = result.metrics
    print(
        f"check: {m.outcomes.requests:,} requests in the window, TTFT p50 "
        f"{m.ttft_s.p50 * 1e3:.2f} ms, ITL per chunk p50 {m.itl_per_chunk_s.p50 * 1e3:.2f} ms, "
        f"TTFT remainder {result.ttft.remainder_share:.2%}, "
        f"ITL remainder {result.itl.remainder_share:.2%}"
    )


if __name__ == "__main__":
    main()
