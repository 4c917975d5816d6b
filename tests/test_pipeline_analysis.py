"""analyzers/pipeline.py on synthetic stage timelines whose answers are known (an ideal
GPipe schedule, a slow stage, a slow link), and on a real `perfdiag run --pp 2`."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pandas as pd
import pytest

from perfdiag.analyzers import pipeline as P

MS = 1_000_000


def _run(events, p=2, m=2, layers=None, requests=4):
    """A run holding pp_* spans: events are (kind, stage, step, microbatch, start, end, bytes
    [, tokens: 4 if not given])."""
    rows = [dict(name=f"pp_{k}", category="python" if k == "compute" else "comm",
                 start_ns=a * MS, dur_ns=(b - a) * MS, rank=s, step_id=st, bytes=nb or None,
                 args=json.dumps({"group": "pp", "microbatch": mb, "tokens": (*tok, 4)[0]}))
            for k, s, st, mb, a, b, nb, *tok in events]  # fmt: skip
    par = {"pipeline_parallel_size": p, "pipeline_microbatches": m}
    if layers:
        par["stage_layers"] = layers
    # each step: `requests` prefills sharing stage 0's tokens of it
    per_step: dict[int, int] = {}
    for k, s, st, _, _, _, _, *tok in events:
        if k == "compute" and s == 0:
            per_step[st] = per_step.get(st, 0) + (*tok, 4)[0]
    steps = pd.DataFrame({"num_prefill_seqs": [requests] * len(per_step),
                          "num_prefill_tokens": list(per_step.values()),
                          "num_decode_seqs": [0] * len(per_step)})  # fmt: skip
    config = {"parallel": par, "engine_config": {"model": {"num_layers": 8}}}
    return SimpleNamespace(spans=pd.DataFrame(rows), steps=steps,
                           manifest=SimpleNamespace(config=config))  # fmt: skip


def _gpipe(p, m, cost, link=0.0, tokens=400):
    """One step of GPipe's forward: stage s computes micro-batch i (of `tokens` tokens) in
    [t, t + cost[s]), the send taking `link` ms before the next stage can start."""
    ev, ready = [], [0.0] * m
    for s in range(p):
        free = 0.0
        for i in range(m):
            if s:
                ev.append(("recv", s, 0, i, free, ready[i], 64))
            start = max(free, ready[i])
            end = start + cost[s]
            ev.append(("compute", s, 0, i, start, end, 0))
            ev.append(("send", s, 0, i, end, end, 64))
            ready[i], free = end + link, end
    for i in range(m):  # rank 0 takes the last stage's output
        ev.append(("recv_out", 0, 0, i, m * cost[0], ready[i], 16))
    return [(*e, tokens) for e in ev]


@pytest.mark.parametrize(("p", "m"), [(2, 1), (2, 4), (4, 4)])
def test_ideal_schedule_meets_the_expected_bubble(p, m):
    s = P.summarize(_run(_gpipe(p, m, [10] * p), p, m))
    assert s.microbatches == m and s.stages == p
    assert s.bubble == pytest.approx(P.expected_bubble(p, m))
    assert s.transfer_share == pytest.approx(0) and s.imbalance == pytest.approx(0)


def test_slow_stage_is_named_and_a_layer_move_evens_it():
    layers = [[0, 4], [4, 8]]
    s = P.summarize(_run(_gpipe(2, 4, [10, 20]), 2, 4, layers))
    assert s.slowest_stage == 1
    assert s.imbalance == pytest.approx(20 / 15 - 1)
    assert s.bubble > P.expected_bubble(2, 4)
    move = P.layer_move(s, layers)
    # stage 1's layers cost 5 ms each, stage 0's 2.5: moving its first layer (4) to stage 0
    # makes 15 / 15 ms, the slowest stage 0.75 of now
    assert (move.from_stage, move.to_stage, move.layers, move.new_split) == (1, 0, [4], [5, 3])
    assert move.forward_ratio == pytest.approx(0.75)


def test_transfers_are_separated_from_waiting():
    s = P.summarize(_run(_gpipe(2, 2, [10, 10], link=2.0), 2, 2))
    # 4 receives of 2 ms each (2 into stage 1, 2 back to rank 0); stage 1's second one
    # lands while it computes the first micro-batch: 3 are exposed
    assert s.window_ns == 34 * MS
    assert s.transfer_share == pytest.approx(3 * 2 / (2 * 34))
    assert s.per_stage.loc[1, "transfer_ns"] == pytest.approx(2 * MS)
    assert s.per_stage.loc[1, "recv_wait_ns"] == pytest.approx(10 * MS)  # stage 0's first


def test_microbatch_advice_is_capped_by_the_requests():
    s = P.summarize(_run(_gpipe(4, 1, [10] * 4), 4, 1, requests=6))
    adv = P.microbatch_advice(s)
    # large micro-batches only (no floor seen): Σ c + 3·max c = 10 + 30·(largest share),
    # shortest at the 6 requests (of 67, 67, 67, 67, 66, 66 tokens) a step holds
    assert adv.microbatches == 6
    assert adv.expected_bubble == pytest.approx(3 / 9)
    assert adv.forward_ratio == pytest.approx((10 + 30 * 67 / 400) / 40)


def test_pp_run_records_every_stage(cli, tmp_path):
    from perfdiag import load_run

    out = tmp_path / "run"
    args = ("--preset", "tiny", "-n", "6", "--closed", "--concurrency", "6", "--prompt-len", "12",
            "--output-len", "4", "--no-device-sampling")  # fmt: skip
    result = cli("run", *args, "--pp", "2", "--pp-microbatches", "3", "--out", out)
    assert result.returncode == 0, result.stderr
    run = load_run(out)
    par = run.manifest.config["parallel"]
    assert par["pipeline_parallel_size"] == 2 and par["stage_layers"] == [[0, 1], [1, 2]]
    s = P.summarize(run)
    assert s.steps == len(run.steps) and s.microbatches_asked == 3
    assert 1 <= s.microbatches <= 3
    assert 0 < s.bubble < 1 and 0 <= s.transfer_share < 1
    assert (s.per_stage["compute_ns"] > 0).all()
    assert s.per_stage.loc[0, "bytes"] > 0  # stage 0 sent activations


def test_bad_pp_flags_are_one_line_errors(cli, tmp_path):
    for flags, msg in ((["--pp", "3"], "at least 3 layers"),
                       (["--pp-layers", "x"], "bad --pp-layers"),
                       (["--pp", "2", "--tp", "2"], "--pp with --tp")):  # fmt: skip
        r = cli("run", "--preset", "tiny", "-n", "1", *flags, "--out", tmp_path / "x")
        assert r.returncode == 1 and msg in r.stderr and "Traceback" not in r.stderr


def test_a_fault_wrapper_passes_the_stage_records_on():
    """Runs with injected faults wrap the recorder: the stage records must reach it."""
    from perfdiag.engine_ref.hooks import EngineObserver, StageEvent
    from perfdiag.probes.faults import FaultObserver, FaultOptions

    got = []

    class Inner(EngineObserver):
        def on_pipeline_stages(self, events) -> None:
            got.extend(events)

    e = StageEvent(1, 0, 0, "compute", 1, 2)
    FaultObserver(Inner(), FaultOptions(step_gap_ms=1.0)).on_pipeline_stages([e])
    assert got == [e]
