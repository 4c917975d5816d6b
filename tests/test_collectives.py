"""analyzers/collectives.py on hand-made spans: waiting for the last rank vs transfer."""

from __future__ import annotations

import pandas as pd

from perfdiag.analyzers import collectives


def _spans(rows):
    return pd.DataFrame(
        [
            {"name": "all_reduce", "category": "comm", "start_ns": s, "dur_ns": e - s,
             "rank": r, "step_id": step, "bytes": 1024, "args": f'{{"seq": {q}}}'}
            for r, step, q, s, e in rows
        ]
    )  # fmt: skip


def test_wait_is_until_the_last_rank_enters():
    # Step 0, collective 0: rank 0 enters at 100, rank 1 at 400; both leave at 500.
    # Collective 1: both enter at 600 and leave at 700 (no waiting).
    rows = [(0, 0, 0, 100, 500), (1, 0, 0, 400, 500), (0, 0, 1, 600, 700), (1, 0, 1, 600, 700)]
    per_rank = collectives.collective_spans(_spans(rows))
    r = per_rank.set_index(["seq", "rank"])
    assert r.loc[(0, 0), "wait_ns"] == 300 and r.loc[(0, 0), "transfer_ns"] == 100
    assert r.loc[(0, 1), "wait_ns"] == 0 and r.loc[(0, 1), "transfer_ns"] == 100
    assert r.loc[(1, 0), "wait_ns"] == 0
    coll = collectives.by_collective(per_rank)
    assert coll.loc[0, "slowest_rank"] == 1
    assert coll.loc[0, "lateness_ns"] == 300
    steps = pd.DataFrame({"step_id": [0], "start_ns": [0], "end_ns": [1000]})
    st = collectives.by_step(per_rank, steps)
    assert st.loc[0, "collectives"] == 2 and st.loc[0, "bytes"] == 2048
    assert st.loc[0, "comm_ns"] == 500 and st.loc[0, "comm_share"] == 0.5
    assert st.loc[0, "wait_ns"] == 300 and st.loc[0, "transfer_ns"] == 200


def test_no_collectives_is_empty():
    spans = _spans([(0, 0, 0, 0, 1)]).assign(category="phase")
    assert not len(collectives.collective_spans(spans))


def _run(rows, step_ns=1000, uncertainty_ns=0, forwards=()):
    """A run of hand-made collectives: `rows` as in _spans; one step per step id, each
    `step_ns` long; `forwards`: (rank, step, dur_ns, cpu_ns) worker forwards."""
    from types import SimpleNamespace

    spans = _spans(rows)
    extra = [{"name": "tp_forward", "category": "python", "start_ns": 0, "dur_ns": d, "rank": r,
              "step_id": st, "bytes": None,
              "args": f'{{"cpu_time_ns": {c}, "involuntary_switches": 1}}'}
             for r, st, d, c in forwards]  # fmt: skip
    spans = pd.concat([spans, pd.DataFrame(extra)], ignore_index=True) if extra else spans
    ids = sorted({step for _, step, *_ in rows})
    steps = pd.DataFrame({"step_id": ids, "start_ns": [i * step_ns for i in ids],
                          "end_ns": [(i + 1) * step_ns for i in ids]})  # fmt: skip
    sync = [{"rank": 0, "uncertainty_ns": 0}, {"rank": 1, "uncertainty_ns": uncertainty_ns}]
    manifest = SimpleNamespace(config={"parallel": {"clock_sync": sync}})
    return SimpleNamespace(spans=spans, steps=steps, manifest=manifest)


def test_one_sided_waiting_names_the_straggler_and_its_cost():
    # Rank 1 enters both collectives of each step 100 ns after rank 0: rank 0 waits
    # 200 ns a step for it, it never waits; steps are 1000 ns.
    rows = []
    for step in (0, 1):
        base = step * 1000
        rows += [(0, step, 0, base + 100, base + 300), (1, step, 0, base + 200, base + 300)]
        rows += [(0, step, 1, base + 500, base + 700), (1, step, 1, base + 600, base + 700)]
    fwd = [(1, s, 900, 300) for s in (0, 1)]  # it got a third of a core
    s = collectives.summarize(_run(rows, forwards=fwd))
    assert s.waited_for_rank == 1
    assert s.imbalance_ms_per_step * 1e6 == 200 and s.imbalance_share == 0.2
    # what the collectives cost themselves: 2 × 100 ns with both ranks in, of 1000
    assert s.own_comm_ms_per_step * 1e6 == 200
    assert s.hosts[1].cpu_per_s == 300 / 900


def test_waiting_both_ways_is_jitter_not_a_straggler():
    rows = [(0, 0, 0, 100, 300), (1, 0, 0, 200, 300),  # rank 0 waits 100 for rank 1
            (0, 0, 1, 600, 700), (1, 0, 1, 500, 700)]  # rank 1 waits 100 for rank 0  # fmt: skip
    s = collectives.summarize(_run(rows))
    assert s.imbalance_share == 0.0


def test_clock_uncertainty_bounds_the_imbalance():
    rows = [(0, 0, 0, 100, 300), (1, 0, 0, 200, 300)]
    s = collectives.summarize(_run(rows, uncertainty_ns=60))
    # a 60 ns offset error moves the one-sided difference by up to 2 × 60 per collective
    assert s.imbalance_share == 0.1 and s.imbalance_bound_share == 0.12
