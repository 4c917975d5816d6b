"""Overlapped scheduling in a run's step timeline: host work hidden behind the forward pass
vs exposed, and, for a run without overlap, what overlap would hide.

engine_ref's overlapped loop (engine_ref/async_step.py, --async-scheduling) records the
next step's scheduling and input preparation as `schedule_ahead` / `prepare_ahead` phases
inside the step whose forward they overlap, and the part of them that ran while the device
still computed as a `host_hidden` sub-span (CUDA only). So per step:
  exposed host = schedule + prepare_inputs + post_process + schedule_ahead + prepare_ahead
                 - host_hidden.

The model of what overlap hides (`predicted_gain_ms`), per device type:
  - CUDA: the forward returns at launch, so the next step's schedule + prepare run while
    the device computes; hidden per step = min(schedule + prepare, device time of the
    forward). The step's post-processing still needs the sampled tokens: never hidden.
  - CPU: the forward runs on the calling thread and its cores; the look-ahead can only
    start when it returns, so nothing is hidden (0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

HOST_IN_STEP = ("schedule", "prepare_inputs", "post_process")
AHEAD = ("schedule_ahead", "prepare_ahead")
OVERLAPPABLE = ("schedule", "prepare_inputs")  # what a look-ahead moves behind the forward
HIDDEN = "host_hidden"


@dataclass(frozen=True)
class HostOverlap:
    overlapped: bool  # the run looked ahead (its steps have schedule_ahead phases)
    device: str  # "cuda" when steps carry device times, else "cpu"
    steps: int
    step_ms: float  # mean wall time per step
    device_ms: float  # mean device time per step (CUDA events, else forward + sample phases)
    exposed_ms: float  # mean host time per step not hidden behind the forward
    hidden_ms: float  # mean host time per step hidden behind the forward
    overlappable_ms: float  # mean schedule + prepare per step run in line (not ahead)
    predicted_gain_ms: dict[str, float]  # per device type: mean ms per step overlap would hide

    @property
    def gain_here_ms(self) -> float:
        return self.predicted_gain_ms[self.device]


def phase_table(spans: pd.DataFrame) -> pd.DataFrame:
    """Seconds in each engine phase, per step (rows: step_id), of the lowest rank."""
    sel = (spans["category"] == "phase").to_numpy() & spans["step_id"].notna().to_numpy()
    ph = spans[sel]
    if "rank" in ph and ph["rank"].notna().any():
        ph = ph[ph["rank"].fillna(0).to_numpy() == ph["rank"].fillna(0).min()]
    if not len(ph):
        return pd.DataFrame()
    frame = pd.DataFrame({"step_id": ph["step_id"].to_numpy(np.int64),
                          "name": ph["name"].astype(str).to_numpy(),
                          "dur_s": ph["dur_ns"].to_numpy(np.float64) / 1e9})  # fmt: skip
    return frame.pivot_table(index="step_id", columns="name", values="dur_s", aggfunc="sum")


def host_overlap(steps: pd.DataFrame, spans: pd.DataFrame) -> HostOverlap | None:
    """The run's overlap figures; None when it recorded no engine phases."""
    phases = phase_table(spans)
    if not len(phases) or not len(steps) or "forward" not in phases:
        return None
    s = steps.drop_duplicates("step_id").set_index("step_id")
    ids = phases.index.intersection(s.index)
    if not len(ids):
        return None
    phases, s = phases.loc[ids], s.loc[ids]

    def col(name: str) -> np.ndarray:
        return np.nan_to_num(phases[name].to_numpy(np.float64)) if name in phases else 0.0

    wall = (s["end_ns"] - s["start_ns"]).to_numpy(np.float64) / 1e9
    gpu = s["gpu_time_ns"].to_numpy("float64", na_value=np.nan) / 1e9
    on_cuda = bool(np.isfinite(gpu).all())
    device = gpu if on_cuda else col("forward") + col("sample")
    hidden = np.minimum(col(HIDDEN), sum(col(p) for p in AHEAD))
    exposed = sum(col(p) for p in (*HOST_IN_STEP, *AHEAD)) - hidden
    movable = sum(col(p) for p in OVERLAPPABLE)
    gain_cuda = np.minimum(movable, gpu if on_cuda else col("forward"))
    overlapped = bool((col("schedule_ahead") > 0).any()) if "schedule_ahead" in phases else False

    def mean_ms(x) -> float:
        return float(np.mean(x) * 1e3) if np.size(x) else 0.0

    return HostOverlap(
        overlapped=overlapped,
        device="cuda" if on_cuda else "cpu",
        steps=len(ids),
        step_ms=mean_ms(wall),
        device_ms=mean_ms(device),
        exposed_ms=mean_ms(exposed),
        hidden_ms=mean_ms(hidden),
        overlappable_ms=mean_ms(movable),
        predicted_gain_ms={"cuda": 0.0 if overlapped else mean_ms(gain_cuda), "cpu": 0.0},
    )
