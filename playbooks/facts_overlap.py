"""Step 4's overlap fact: host scheduling that runs exposed between forward passes when
overlapped scheduling (--async-scheduling) could hide it. Arithmetic and the per-device
model in analyzers/host_overlap.py."""

from __future__ import annotations

from ..analyzers.actions import Setting, run_action
from ..analyzers.host_overlap import host_overlap
from ..analyzers.run_config import section
from .facts import Fact, TriageContext, Unavailable, ev, fact, share

KNOBS = ("engine_ref and vLLM: --async-scheduling; SGLang overlaps by default "
         "(--disable-overlap-schedule turns it off)")  # fmt: skip


@fact(
    "overlap_off",
    provides=(
        "device",
        "steps",
        "step_ms",
        "host_ms",
        "overlappable_ms",
        "forward_ms",
        "gain_cuda_ms",
        "gain_here_ms",
        "gain_pct",
        "advice",
    ),
)
def overlap_off(ctx: TriageContext) -> Fact | Unavailable:
    """Share of each step spent scheduling and preparing inputs in line, with overlapped
    scheduling off: the host work a look-ahead would run while the forward computes, and
    the ITL it would save on this device (none on a CPU, whose forward holds the thread)."""
    run = ctx.run
    o = host_overlap(run.steps, run.spans)
    if o is None:
        return Unavailable("the run has no engine phases (a --target run, or phases off)")
    if o.overlapped or section(ctx.run_options, "engine").get("async_scheduling"):
        return Unavailable("overlapped scheduling was on")
    value = share(o.overlappable_ms, o.step_ms)
    gain_here, gain_cuda = o.gain_here_ms, o.predicted_gain_ms["cuda"]
    if o.device == "cuda":
        advice = (f"Overlap scheduling with the forward (--async-scheduling): about "
                  f"{gain_cuda:.2f} ms of the {o.step_ms:.2f} ms step would run while the GPU "
                  f"computes (min of schedule + prepare and the forward's device time). "
                  f"{KNOBS}.")  # fmt: skip
    else:
        advice = (f"On a GPU, overlapped scheduling (--async-scheduling) would hide about "
                  f"{gain_cuda:.2f} ms per step (if the forward takes what it takes here); on "
                  f"this CPU it hides nothing — the forward holds the thread and the cores, so "
                  f"the look-ahead runs after it — make the host work itself cheaper instead "
                  f"(profile it: perfdiag run --profile-steps A:B). {KNOBS}.")  # fmt: skip
    evidence = (
        ev("device", "device", o.device),
        ev("steps", "steps", o.steps),
        ev("step_ms", "step time", o.step_ms, "ms"),
        ev("host_ms", "exposed host time per step", o.exposed_ms, "ms"),
        ev(
            "overlappable_ms",
            "schedule + prepare per step (overlap could move)",
            o.overlappable_ms,
            "ms",
        ),
        ev("forward_ms", "device time per step", o.device_ms, "ms"),
        ev("gain_cuda_ms", "predicted hidden per step on CUDA", gain_cuda, "ms"),
        ev("gain_here_ms", f"predicted hidden per step here ({o.device})", gain_here, "ms"),
        ev("gain_pct", "predicted step time saved here", share(gain_here, o.step_ms), "%"),
        ev("advice", "advice", advice),
    )
    expect = (f"ITL about {gain_here:.2f} ms lower per step" if gain_here > 0 else
              "no ITL change on a CPU (nothing overlaps); on CUDA "
              f"{gain_cuda:.2f} ms per step lower")  # fmt: skip
    action = run_action("itl.p50", Setting("engine.async_scheduling", False, True),
                        expect=expect)  # fmt: skip
    impact = share(gain_here, o.step_ms)
    return Fact(value, evidence, impact=impact if impact == impact else 0.0, action=action)
