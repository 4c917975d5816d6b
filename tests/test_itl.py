"""ITL attribution on hand-built runs (timelines in tests/data/serving_runs.py, ms)."""

import numpy as np
import pytest
import serving_runs as runs

from perfdiag import load_run
from perfdiag.analyzers.itl import CAUSES, attribute_itl
from perfdiag.analyzers.lifecycle import build_lifecycle
from perfdiag.analyzers.metrics import delivery_gaps
from perfdiag.analyzers.steptime import StepTimeline

MS = 1e-3
COLS = [f"{c}_s" for c in CAUSES]


def attribute(path):
    run = load_run(path)
    lc = build_lifecycle(run)
    steps = StepTimeline.from_run(run, lc.origin_ns)
    return attribute_itl(lc, delivery_gaps(lc), steps, ~lc.requests["is_warmup"].to_numpy())


def gap_ms(a, rid, chunk):
    f = a.per_gap
    row = f[(f["request_id"] == rid) & (f["chunk"] == chunk)].iloc[0]
    return {c: pytest.approx(row[c] / MS, abs=1e-9) for c in ["gap_s", *COLS]}


def expect(gap, **ms):
    return {"gap_s": gap} | {c: 0.0 for c in COLS} | {f"{k}_s": v for k, v in ms.items()}


@pytest.fixture(scope="module")
def basic(tmp_path_factory):
    return attribute(runs.basic(tmp_path_factory.mktemp("itl") / "basic"))


def test_a_decode_step_shared_with_a_prefill_chunk_is_interference(basic):
    # A, 41 → 46: step 1 [42, 44.5 sampling] is 3 prefill tokens (B) + 1 decode (A):
    # 3/4 of its 2.5 ms is interference; no step ran 41 → 42 (host); 44.5 → 46 stream-out
    assert gap_ms(basic, "A", 1) == expect(5, decode=0.625, interference=1.875, host_gap=1,
                                           stream_out=1.5)  # fmt: skip


def test_a_two_token_chunk_spans_two_decode_steps(basic):
    # A, 46 → 52 carries tokens 3 and 4: steps 2 [46, 48] and 3 [48.5, 50 sampling] are
    # its own decodes (3.5 ms), 48 → 48.5 is a host gap, 50 → 52 stream-out
    assert gap_ms(basic, "A", 2) == expect(6, decode=3.5, host_gap=0.5, stream_out=2)
    row = basic.per_gap[(basic.per_gap["request_id"] == "A") & (basic.per_gap["chunk"] == 2)]
    assert row["tokens"].iloc[0] == 2


def test_plain_decode_gaps(basic):
    # B, 45.5 → 48.2: step 2 [46, 47.5] decode, 45.5 → 46 host, 47.5 → 48.2 stream-out
    assert gap_ms(basic, "B", 1) == expect(2.7, decode=1.5, host_gap=0.5, stream_out=0.7)
    assert gap_ms(basic, "B", 2) == expect(2.8, decode=1.5, host_gap=0.3, stream_out=1.0)


def test_gaps_without_engine_events_are_remainder(basic):
    assert gap_ms(basic, "C", 1) == expect(1, remainder=1)
    assert basic.remainder_share == pytest.approx(1 / (5 + 6 + 2.7 + 2.8 + 1))


def test_parts_add_up_and_the_tail_is_the_longest_gaps(basic):
    f = basic.per_gap
    assert np.allclose(f[COLS].sum(axis=1), f["gap_s"], atol=1e-12)
    assert basic.mean.gaps == 5
    assert basic.tail.gaps == 1 and basic.tail.gap_s == pytest.approx(6 * MS)
    assert basic.dominant.decode == 3  # A's 6 ms gap, B's two
    assert basic.dominant.interference == 1 and basic.dominant.remainder == 1


def test_a_preemption_in_the_gap(tmp_path):
    a = attribute(runs.preempt(tmp_path / "pre"))
    # D, 7.5 → 12.5: preempted at 8.1; the steps until its token is sampled (step 2
    # [8, 9], step 3 [10, 11.5]) are preemption, 7.5 → 8 and 9 → 10 host, then stream-out
    assert gap_ms(a, "D", 2) == expect(5, preemption=2.5, host_gap=1.5, stream_out=1)
    # D, 5.5 → 7.5: step 1 [6, 6.6 sampling] holds F's 4-token chunk and D's decode
    assert gap_ms(a, "D", 1) == expect(2, decode=0.12, interference=0.48, host_gap=0.5,
                                       stream_out=0.9)  # fmt: skip
    assert a.dominant.preemption == 1
