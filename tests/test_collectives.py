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
