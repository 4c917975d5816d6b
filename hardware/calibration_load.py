"""When a calibration's figures are suspect: other processes held cores while it measured.
`perfdiag calibrate` (probes/cpu_load.py) warns by it and the roofline's over-roof note
(analyzers/roof_check.py) names it; both read it here, below them."""

from __future__ import annotations

import math

# Other processes holding this share of the machine's cores during calibration make its
# figures suspect (host.py's OTHERS_PRESENT_SHARE: 0.25 cores of 2, 12 of 96).
BUSY_OTHERS_SHARE = 0.125


def busy_others(others_cores, cores) -> bool:
    """Other processes held at least BUSY_OTHERS_SHARE of the machine's cores."""
    ok = isinstance(others_cores, int | float) and math.isfinite(others_cores)
    ok = ok and isinstance(cores, int | float) and cores > 0
    return bool(ok and others_cores >= BUSY_OTHERS_SHARE * cores)
