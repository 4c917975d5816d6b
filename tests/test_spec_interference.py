"""The model by which speculation explains others' work in a prompt's prefill steps
(playbooks/spec_interference.py): each step of the window sheds a share of its time, all
of it others' work, and the share of TTFT is taken again."""

from __future__ import annotations

import pandas as pd
import pytest

from perfdiag.playbooks.spec_interference import _share_shed


def _frame():
    # Two requests: TTFT 10 ms each, 4 ms others', 2 ms own, 1 ms step overhead.
    return pd.DataFrame(
        {
            "ttft_s": [0.010, 0.010],
            "prefill_others_s": [0.004, 0.004],
            "prefill_own_s": [0.002, 0.002],
            "step_overhead_s": [0.001, 0.001],
        }
    )


def test_nothing_shed_leaves_the_share():
    assert _share_shed(_frame(), 0.0) == pytest.approx(0.4)


def test_a_shed_share_of_the_window_comes_out_of_others_work_and_ttft():
    # A third of the 7 ms window: others 4 → 1.67 ms, TTFT 10 → 7.67 ms.
    assert _share_shed(_frame(), 1 / 3) == pytest.approx((0.004 - 0.007 / 3) / (0.010 - 0.007 / 3))


def test_never_more_than_others_work():
    assert _share_shed(_frame(), 1.0) == pytest.approx(0.0)
