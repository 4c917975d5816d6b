"""Work above 100 % of its roof: the ceilings, not the work, are wrong.

Nothing attains more than its roof; a step or kernel that seems to says the ceilings
under it are low — a datasheet below what this device attains, or figures measured
while other processes held the CPU (`perfdiag calibrate` records how much: its
details' "others_load"). Said once, beside the roofline, instead of printing 125 %
silently.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..hardware.calibration_load import busy_others
from ..hardware.ceilings import MEASURED, Ceilings


def over_roof_note(frame: pd.DataFrame, ceilings: Ceilings, noun: str = "steps") -> str | None:
    """One line when any row of a roofline table (`pct_of_roof`) exceeds 100 %, else None."""
    if not len(frame) or "pct_of_roof" not in frame:
        return None
    pct = frame["pct_of_roof"].to_numpy(np.float64, na_value=np.nan)
    known = pct[np.isfinite(pct)]
    over = known[known > 100.0]
    if not len(over):
        return None
    text = (
        f"{len(over)} of {len(known)} {noun} above 100 % of their roof (up to "
        f"{over.max():,.0f} %): the ceilings look low"
    )
    if ceilings.kind != MEASURED:
        return text + " (datasheet figures): measure this machine's with perfdiag calibrate"
    load = ceilings.details.get("others_load")
    others = load.get("others_cores") if isinstance(load, dict) else None
    cores = load.get("cores") if isinstance(load, dict) else None
    if busy_others(others, cores):
        return text + (
            f"; other processes used {others:.1f} cores while they were measured: calibrate "
            "again on a quiet machine"
        )
    return text + ": calibrate again on a quiet machine (perfdiag calibrate)"
