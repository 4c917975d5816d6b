"""`perfdiag compare` keeps ITL per chunk (DOMAIN.md §4) but says so where it matters:
when chunks carry several tokens (speculation, a server streaming several tokens a
chunk), longer gaps between chunks are no slower tokens. The ITL and worst-gap rows then
carry a note pointing at TPOT, and when TPOT improved they do not call the run worse on
their own (speculation read as ITL +24 % "worse" while TPOT fell 72 %)."""

from __future__ import annotations

import numpy as np
import pytest
import serving_runs as runs
from typer.testing import CliRunner

from perfdiag import load_run
from perfdiag.analyzers.compare import metric_deltas
from perfdiag.analyzers.serving import analyze_serving
from perfdiag.cli import app

TOKENS = 17  # per request: the first token alone, then 16 in chunks


def _stream(path, per_chunk: int, gap_ms: float, seed: int):
    """80 client-side requests, 20 ms apart: TTFT ~30 ms, then 16 tokens in chunks of
    `per_chunk`, `gap_ms` (± 5 %) apart."""
    rng = np.random.default_rng(seed)
    requests, events = [], []
    for i in range(80):
        rid, t = f"r{i:03d}", 20.0 * i
        requests.append(runs.Request(rid, 8, TOKENS, None, "length"))
        t += 30.0 * rng.uniform(0.9, 1.1)
        events += [runs.client(rid, "sent", 20.0 * i), runs.client(rid, "first_token", t),
                   runs.client(rid, "chunk", t, 1)]  # fmt: skip
        for _ in range((TOKENS - 1) // per_chunk):
            t += gap_ms * rng.uniform(0.95, 1.05)
            events.append(runs.client(rid, "chunk", t, per_chunk))
        events.append(runs.client(rid, "done", t, TOKENS))
    return runs.write(path, requests, events)


@pytest.fixture(scope="module")
def streams(tmp_path_factory):
    root = tmp_path_factory.mktemp("streams")
    return {
        "plain": _stream(root / "plain", 1, 10.0, 1),
        "spec": _stream(root / "spec", 4, 12.4, 2),  # ITL +24 %, TPOT 3.1 ms (-69 %)
        "slower": _stream(root / "slower", 1, 12.4, 3),  # one token a chunk, 24 % slower
        "merged": _stream(root / "merged", 2, 24.8, 4),  # 2 a chunk, TPOT 12.4 ms: worse
    }


def _deltas(streams, a, b):
    sa, sb = (analyze_serving(load_run(streams[k]), steady=False) for k in (a, b))
    return {d.metric: d for d in metric_deltas(sa, sb, n_boot=300)}


def test_per_chunk_gaps_under_speculation_point_at_tpot_and_decide_nothing(streams):
    d = _deltas(streams, "plain", "spec")
    assert d["tpot.p50"].verdict == "better" and d["tpot.p50"].relative < -0.6
    itl = d["itl.p50"]
    assert itl.verdict == "worse" and itl.relative == pytest.approx(0.24, abs=0.03)  # per chunk
    assert "per chunk" in itl.note and "3.40 tokens in B (1.00 in A)" in itl.note
    assert not itl.decisive
    assert not d["stall.p50"].decisive and d["stall.p50"].note == itl.note
    assert d["ttft.p50"].note == "" and d["ttft.p50"].decisive


def test_one_token_a_chunk_keeps_the_itl_verdict_as_it_was(streams):
    d = _deltas(streams, "plain", "slower")
    assert d["itl.p50"].verdict == "worse" and d["itl.p50"].note == "" and d["itl.p50"].decisive


def test_several_tokens_a_chunk_without_a_tpot_gain_is_noted_and_still_counts(streams):
    d = _deltas(streams, "plain", "merged")
    assert d["tpot.p50"].verdict == "worse"
    assert "per chunk" in d["itl.p50"].note and d["itl.p50"].decisive


def _compare(a, b) -> str:
    result = CliRunner().invoke(app, ["compare", str(a), str(b), "--resamples", "200"],
                                terminal_width=200)  # fmt: skip
    assert result.exit_code == 0, result.output
    return result.stdout


def test_compare_notes_the_itl_row_and_does_not_call_speculation_worse(streams, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    text = _compare(streams["plain"], streams["spec"])
    assert "ITL p50 (ms) *" in text
    assert "* ITL and worst gaps are per chunk, and a chunk carries 3.40 tokens" in text
    assert "read TPOT (p50 -69%, better)" in text
    assert "got worse" not in text  # the verdict line: no latency regression from ITL alone
    worse = _compare(streams["plain"], streams["slower"])
    assert "step 7: ITL p50 got worse by 24%" in worse  # one token a chunk: as before
    assert "are per chunk" not in worse
