"""Which engine steps JIT-compiled a kernel (probes/triton_probe.py marks such a launch
`"compiled": true`). A compile is a warm-up cost paid once per specialisation: the device
idles while the host compiles, so the step's time says nothing about its batch. The step
cost model leaves these steps out of its fit, and the roofline leaves such launches out.

Evidence only: a run without the probe's marks (older runs, the CPU interpreter, a Triton
that hides its cache) has no compiled steps, not "none compiled"; `compiled_launches`
then returns None.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

MARK = '"compiled": true'  # as json.dumps writes the probe's flag


def compiled_launches(spans: pd.DataFrame) -> pd.Series | None:
    """Boolean per span: a Triton launch that compiled its kernel. None where no launch
    of the run was timed on the device (nothing can say)."""
    triton = spans["category"].astype(str).eq("triton").to_numpy()
    if not triton.any():
        return None
    marked = np.zeros(len(spans), dtype=bool)
    args = spans["args"].to_numpy()[triton]
    marked[triton] = [isinstance(a, str) and MARK in a for a in args]
    return pd.Series(marked, index=spans.index)


def compiled_step_ids(spans: pd.DataFrame) -> np.ndarray | None:
    """Step ids whose launches include a JIT compile (None: no device-timed launches)."""
    marked = compiled_launches(spans)
    if marked is None:
        return None
    steps = spans.loc[marked.to_numpy(), "step_id"].dropna()
    return np.unique(steps.to_numpy(np.int64))
