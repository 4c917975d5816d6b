"""How much CPU other processes used while this process measured something.

`perfdiag calibrate` keeps the fastest of repeated timings, which shields it from short
interruptions but not from a neighbour that holds cores the whole time: the ceilings
then come out low, and later steps sit above 100 % of their roof. The meter reads the
machine's busy time (psutil.cpu_times: user, nice, system, irq, softirq; steal is the
hypervisor's, not a process's) and this process's own CPU time (all its threads, and
children it waited for) over the same interval: what is left is the neighbours'.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

from ..hardware.calibration_load import busy_others  # the roofline's note uses it too


@dataclass(frozen=True)
class OthersLoad:
    cores: int  # logical cores of the machine
    seconds: float  # wall time measured over
    others_cores: float  # mean cores other processes used (NaN: unknown)
    own_cores: float  # mean cores this process used

    @property
    def busy(self) -> bool:
        return busy_others(self.others_cores, self.cores)

    def to_dict(self) -> dict:
        return {
            "cores": self.cores,
            "seconds": round(self.seconds, 3),
            "others_cores": None if math.isnan(self.others_cores) else round(self.others_cores, 3),
            "own_cores": round(self.own_cores, 3),
        }

    @classmethod
    def from_dict(cls, d: dict) -> OthersLoad:
        others = d.get("others_cores")
        others = float("nan") if others is None else float(others)
        return cls(int(d["cores"]), float(d["seconds"]), others, float(d["own_cores"]))

    def warning(self) -> str | None:
        """One line when the machine was busy, else None."""
        if not self.busy:
            return None
        return (
            f"other processes used {self.others_cores:.1f} of {self.cores} cores while "
            "measuring: the ceilings may be low (steps would then sit above 100 % of their "
            "roof); calibrate again on a quiet machine"
        )


def _machine_busy_s() -> float | None:
    try:
        import psutil

        t = psutil.cpu_times()
    except (ImportError, OSError):
        return None
    return sum(getattr(t, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq"))


def _own_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class LoadMeter:
    """`with LoadMeter() as m: …` then `m.result` (an OthersLoad)."""

    result: OthersLoad | None = None

    def __enter__(self) -> LoadMeter:
        self._t0, self._busy0, self._own0 = time.monotonic(), _machine_busy_s(), _own_s()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.monotonic() - self._t0
        busy, own = _machine_busy_s(), _own_s() - self._own0
        cores = os.cpu_count() or 1
        others = float("nan")
        if busy is not None and self._busy0 is not None and wall > 0:
            # clock ticks round both sides: never below 0
            others = max(0.0, (busy - self._busy0 - own) / wall)
        self.result = OthersLoad(cores, wall, others, own / wall if wall > 0 else float("nan"))
