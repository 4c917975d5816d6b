"""chunk-too-small's overhead is inflated as its steps are (playbooks/facts_scheduling.py):
the step cost model prices steps uninflated while TTFT holds their inflation, so a
neighbour taking a share of every step must not shrink the chunk's share of TTFT."""

from __future__ import annotations

import pandas as pd
import pytest

from perfdiag.playbooks.facts_scheduling import _inflation_factor


def test_the_factor_is_the_prefill_steps_time_over_it_less_inflation():
    pr = pd.DataFrame(
        {
            "prefill_own_s": [0.004, 0.002, 0.0],
            "step_overhead_s": [0.003, 0.001, 0.0],
            "prefill_others_s": [0.001, 0.001, 0.0],
            "inflation_s": [0.008, 0.0, 0.001],
        }
    )
    # 8 ms of modelled steps inflated by 8 ms: twice; nothing inflated: 1; no steps: 1
    assert _inflation_factor(pr).tolist() == pytest.approx([2.0, 1.0, 1.0])


def test_a_uniform_theft_leaves_the_share_where_it_was():
    """Steps stretched by 1/(1 − L) alike (a TTFT of steps only): overhead × factor over
    the inflated TTFT is the share without the neighbour; unscaled it would read 1 − L
    of it."""
    own, overhead, others, loss = 0.006, 0.003, 0.001, 0.4
    window = own + overhead + others
    inflation = window * (1 / (1 - loss) - 1)
    pr = pd.DataFrame(
        {
            "prefill_own_s": [own],
            "step_overhead_s": [overhead],
            "prefill_others_s": [others],
            "inflation_s": [inflation],
        }
    )
    ttft_now = window + inflation
    assert overhead * _inflation_factor(pr)[0] / ttft_now == pytest.approx(overhead / window)
    assert overhead / ttft_now == pytest.approx((1 - loss) * overhead / window)
