"""A closed loop held at its limit queues in proportion to the slot time each request
holds (queue = S·(n − c)/c), so a saving in slot time saves that share of the queue too:
TTFT falls by Δ·(1 + queue / S). An open loop, or a run that cannot say, claims 1."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from perfdiag.playbooks.facts import slot_factor


def _ctx(mode, queue_s, input_s, e2e):
    parts = {
        "ttft": SimpleNamespace(mean=SimpleNamespace(queue_s=queue_s, input_s=input_s)),
        "metrics": SimpleNamespace(per_request=pd.DataFrame({"e2e_s": e2e})),
    }
    options = {"workload": {"arrival": {"mode": mode, "concurrency": 8}}}
    return SimpleNamespace(get=parts.get, run_options=options)


def test_a_closed_loop_at_its_limit_multiplies_a_slot_saving():
    # 8 clients, cap 4: slot time 0.2 s, queue 0.2 · (8 − 4) / 4 = 0.2 s, E2E 0.4 s
    assert slot_factor(_ctx("closed", 0.2, 0.0, [0.4, 0.4])) == pytest.approx(2.0)
    # input outside the slot is not slot time
    assert slot_factor(_ctx("closed", 0.1, 0.1, [0.4, 0.4])) == pytest.approx(1.5)


@pytest.mark.parametrize(
    "mode, queue_s, e2e",
    [("open", 0.2, [0.4]), ("closed", 0.0, [0.4]), ("closed", 0.2, [np.nan]),
     (None, 0.2, [0.4])],
)  # fmt: skip
def test_otherwise_nothing_is_claimed(mode, queue_s, e2e):
    assert slot_factor(_ctx(mode, queue_s, 0.0, e2e)) == 1.0
