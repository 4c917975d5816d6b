"""ttft-prefill-interference's advice priced (issue 35): others' work in a request's
prefill steps is cut, by the advised finer chunk, to one slice and the decodes per step,
while the prompt pays the steps it adds. Severity follows that prediction, not the
removal of all others' work."""

from types import SimpleNamespace

import numpy as np
import pandas as pd

from benchmarks.synthetic_steps import cpu_cost, timeline
from perfdiag.analyzers.actions import Setting, run_action
from perfdiag.analyzers.step_cost import fit_step_cost
from perfdiag.playbooks.facts_latency import TTFT_TARGET, _others_saved

COST = fit_step_cost(timeline(cpu_cost, seed=5, steps=300, stalls=False))


def _ctx(decodes=4.0):
    parts = {"step_cost": COST, "composition": SimpleNamespace(mean_decode_seqs=decodes)}
    return SimpleNamespace(get=parts.get)


def _requests(others, steps, tokens):
    return pd.DataFrame({"prefill_others_s": others, "prefill_steps": steps,
                         "prefill_tokens": tokens})  # fmt: skip


def test_unpriced_advice_keeps_the_removal_bound_and_no_finer_chunk_saves_nothing():
    req = _requests([0.5], [2.0], [1024.0])
    assert _others_saved(_ctx(), req, None, None) == (None, None)
    saved, action = _others_saved(_ctx(), req, None, float("inf"))
    assert saved.tolist() == [0.0] and action is None


def test_the_saving_is_others_beyond_a_slice_per_step_less_the_added_steps():
    chunk = run_action("stall.p90", Setting("engine.chunk_size", 512, 256), expect="x")
    slice_s = float(COST.token_cost_s(256, 4.0, with_chunk=True))
    decode_s = float(COST.predict_s(0.0, 4.0) - COST.predict_s(0.0, 0.0))
    heavy = 5 * (slice_s + decode_s) + 0.4  # far more others' work than a slice a step
    req = _requests([heavy, 0.001], [2.0, 2.0], [1024.0, 1024.0])
    saved, action = _others_saved(_ctx(), req, chunk, slice_s)
    # 1024 tokens in 256-token chunks: 4 steps, 2 more than now
    want = heavy - 4 * (slice_s + decode_s) - 2 * COST.slice_cost_s
    assert np.isclose(saved[0], want) and saved[0] > 0
    assert saved[1] < 0  # little interference: slicing finer only costs this request
    assert action.target == TTFT_TARGET and action.settings == chunk.settings
