"""Shared test set-up and fixtures.

Without a GPU, Triton kernels run in interpreter mode, which must be chosen before any
kernel module is imported: hence the environment variable at the very top. With an
NVIDIA driver present (its control device exists) kernels compile for the GPU, so the
GPU-marked tests exercise real kernels; importing torch here just to ask would slow
every test session.
"""

import os

if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import subprocess
import sys
from pathlib import Path

import pytest

# Real Kineto traces (HTA's test data, MIT: tests/data/kineto/LICENSE); in the repository,
# so a missing file is a failure, never a skip.
KINETO = Path(__file__).resolve().parent / "data" / "kineto"


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the real `perfdiag` command in a fresh interpreter, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "perfdiag", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def sample_run(tmp_path):
    """A small complete run with rows in every table, and the rows written."""
    from perfdiag.traces.schema import Counter, Request, RequestEvent, Span, Step
    from perfdiag.traces.writer import RunWriter

    t0 = 1_700_000_000_123_456_789  # far beyond float64's exact-integer range
    rows = {
        "requests": [
            Request("r0", prompt_tokens=12, output_tokens=3, finish_reason="stop"),
            Request("r1", prompt_tokens=7, finish_reason="abort", is_warmup=True, error="x"),
        ],
        "request_events": [
            RequestEvent("r0", "arrival", t0 + 1),
            RequestEvent("r0", "prefill_chunk", t0 + 2, step_id=0, num_tokens=12),
            RequestEvent("r0", "first_token", t0 + 3, step_id=0),
            RequestEvent("r1", "sent", t0 + 5, side="client"),
        ],
        "steps": [
            Step(
                0,
                t0,
                t0 + 999_999_999,
                num_prefill_seqs=1,
                num_prefill_tokens=12,
                kv_blocks_used=3,
                gpu_time_ns=None,
            ),
            Step(
                1,
                t0 + 1_000_000_000,
                t0 + 1_000_000_001,
                num_decode_seqs=1,
                num_context_tokens=13,
                num_waiting=0,
            ),
        ],
        "spans": [
            Span("aten::mm", "cpu_op", t0 + 7, 11, pid=1, tid=2, step_id=0, correlation=5),
            Span(
                "gemm_kernel",
                "kernel",
                t0 + 9,
                3,
                device=0,
                stream=7,
                correlation=5,
                flops=2**40 + 1,
                bytes=2**33 + 3,
                args='{"grid": [1, 2, 3]}',
            ),
        ],
        "counters": [
            Counter("kv_blocks_used", t0 + 4, 3.0, "engine"),
            Counter("gpu_util_pct", t0 + 8, 55.5, "gpu0"),
        ],
    }
    path = tmp_path / "run"
    with RunWriter(path, command=["pytest"], config={"seed": 1}) as writer:
        for table, table_rows in rows.items():
            for row in table_rows:
                writer.table(table).append(row)
    return path, rows
