"""Prefill interference on an overloaded data-parallel replica (issue 35, dev miss
g2001-0000-s1): a weighted router sends the hot replica four requests for each one the
other gets, so the hot replica's decodes meet four times as many prefills. Balanced
routing would cut that replica's prefill rate to an even share: the ITL spikes are in
part the imbalance's, which is what to fix first."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfdiag import load_run
from perfdiag.playbooks.balanced_interference import balanced_tail_share
from perfdiag.playbooks.evaluate import run_triage
from perfdiag.playbooks.facts import TriageContext
from perfdiag.traces.schema import Request, RequestEvent, Step
from perfdiag.traces.writer import RunWriter

MS = 1_000_000
OUTPUT = 16


def _replica_steps(replica, arrivals, sid, steps, events, chunk_ms):
    """One engine loop: each step decodes every running request and prefills the oldest
    waiting prompt whole (one chunk); decode steps cost 10 ms + 1 ms a sequence, a
    prompt `chunk_ms` more whatever its length (the kept run's step cost model priced
    its short prompts' chunks so: nothing a token). Records engine and client events as
    perfdiag run does."""
    pending = sorted(arrivals)  # (arrival_ns, request id, prompt tokens)
    running: dict[str, int] = {}  # id -> tokens out
    t = pending[0][0]
    while pending or running:
        if not running and pending[0][0] > t:
            t = pending[0][0]
        new = pending.pop(0) if pending and pending[0][0] <= t else None
        waiting = sum(1 for a, *_ in pending if a <= t)
        dur = (10 + len(running)) * MS + (chunk_ms * MS if new else 0)
        steps.append(Step(sid, t, t + dur, num_prefill_seqs=int(new is not None),
                          num_prefill_tokens=new[2] if new else 0,
                          num_decode_seqs=len(running), num_context_tokens=60 * len(running),
                          num_waiting=waiting, num_running=len(running) + (new is not None),
                          replica=replica, kv_blocks_used=4, kv_blocks_free=60))  # fmt: skip
        end = t + dur
        for rid in list(running):
            running[rid] += 1
            n = running[rid]
            events += [RequestEvent(rid, "token", end, "engine", sid, n),
                       RequestEvent(rid, "chunk", end + MS // 5, "client", None, 1)]  # fmt: skip
            if n == OUTPUT:
                events += [RequestEvent(rid, "finished", end, "engine", sid, detail="length"),
                           RequestEvent(rid, "done", end + MS // 5, "client")]  # fmt: skip
                del running[rid]
        if new:
            rid = new[1]
            events += [RequestEvent(rid, "scheduled", t, "engine", sid, new[2]),
                       RequestEvent(rid, "first_token", end, "engine", sid, 1),
                       RequestEvent(rid, "first_token", end + MS // 5, "client"),
                       RequestEvent(rid, "chunk", end + MS // 5, "client", None, 1)]  # fmt: skip
            running[rid] = 1
        sid += 1
        t = end
    return sid


def _weighted_run(path, weights=(3, 2), rps=14.0, n=120, chunk_ms=30, prompts=(16, 48)):
    """Open-loop arrivals at `rps` (exponential gaps, seeded), routed in proportion to
    `weights` (smooth weighted round robin, as engine_ref/router.py does)."""
    rng = np.random.default_rng(7)
    t0 = 10**12
    at = t0 + np.cumsum(rng.exponential(1 / rps, n) * 1e9).astype(np.int64)
    reqs, events, steps = [], [], []
    current = [0] * len(weights)
    by_replica: list[list] = [[] for _ in weights]
    for i, a in enumerate(at):
        current = [c + w for c, w in zip(current, weights, strict=True)]
        r = int(np.argmax(current))
        current[r] -= sum(weights)
        rid, prompt = f"r{i}", int(rng.integers(*prompts))
        reqs.append(Request(rid, prompt, OUTPUT, 0, "length", replica=r))
        sent = int(a)
        events += [RequestEvent(rid, "sent", sent, "client"), RequestEvent(rid, "arrival", sent),
                   RequestEvent(rid, "queued", sent)]  # fmt: skip
        by_replica[r].append((int(a), rid, prompt))
    sid = 0
    for r, arrivals in enumerate(by_replica):
        sid = _replica_steps(r, arrivals, sid, steps, events, chunk_ms)
    router = "weighted:" + ",".join(map(str, weights))
    config = {"data_parallel": {"size": len(weights), "router": router},
              "run_options": {"engine": {"dp": len(weights), "router": router,
                                         "chunk_size": 256},
                              "workload": {"arrival": {"mode": "open", "rate": rps}}}}  # fmt: skip
    with RunWriter(path, command=["test"], config=config, environment_info={}) as w:
        w.table("requests").extend(reqs)
        w.table("request_events").extend(events)
        w.table("steps").extend(steps)
    return load_run(path)


@pytest.fixture(scope="module")
def hot(tmp_path_factory):
    return run_triage(TriageContext(_weighted_run(tmp_path_factory.mktemp("dp") / "run")))


def test_the_run_has_the_shape_of_the_miss(hot):
    # both warnings, the interference explaining more of its metric than the imbalance
    imb, itl = hot.by_check("dp-imbalance"), hot.by_check("itl-prefill-interference")
    assert imb is not None and imb.severity == "warning"
    assert itl is not None and itl.severity == "warning"
    assert itl.impact > imb.impact


def test_the_imbalance_ranks_before_the_interference_it_feeds(hot):
    ranked = [f.check for f in hot.findings]
    assert ranked.index("dp-imbalance") < ranked.index("itl-prefill-interference")
    itl = hot.by_check("itl-prefill-interference")
    # 3 : 2 gives the hot replica 60 % of the prompts: balanced, 0.5 / 0.6 of its prefills
    k = next(e.value for e in itl.evidence if e.name == "balanced_factor")
    assert k == pytest.approx(0.5 / 0.6, abs=0.03)
    # the spikes stay prefill's at that rate (one prompt still stalls a decode): in part
    without = next(e.value for e in itl.evidence if e.name == "without_dp_imbalance")
    assert without >= 0.4
    assert itl.in_part_from == "dp-imbalance" and itl.consequence_of is None


def _gaps(n=2000, hit_share=0.02, seed=3):
    """Decode gaps of 12 ± 1 ms; `hit_share` of them also hold a 30 ms prefill."""
    rng = np.random.default_rng(seed)
    gap = 0.012 + 0.001 * rng.standard_normal(n)
    part = np.where(rng.random(n) < hit_share, 0.030, 0.0)
    return pd.DataFrame({"gap_s": gap + part, "interference_s": part, "probe_s": 0.0})


def test_the_model_reads_the_checks_value_at_todays_rate():
    g = _gaps()
    tail = g["gap_s"] >= np.percentile(g["gap_s"], 99)
    value = g["interference_s"][tail].mean() / g["gap_s"][tail].mean()
    assert balanced_tail_share(g, 1.0, 0.012, 3.0, 20.0) == pytest.approx(value)


def test_spikes_rarer_than_the_tail_leave_it_to_the_decodes():
    # 2 % of gaps met a prefill; at 0.2 of that rate (0.4 %) the worst 1 % is mostly
    # clean gaps and no longer stands 3× above the median: the check would not fire
    g = _gaps()
    assert balanced_tail_share(g, 0.2, 0.012, 3.0, 20.0) == 0.0
    # at 0.7 of the rate (1.4 %) the tail is still all prefill
    assert balanced_tail_share(g, 0.7, 0.012, 3.0, 20.0) > 0.6
