"""The host the engine ran on: was it shared, did a probe hold the engine, and what made
inflated steps slow.

Evidence, per step (probes/recorder.py) and per sample (probes/device_sampler.py):
- the CPU time the process got during the step and how often the kernel preempted it
  (involuntary context switches). A process alone on its cores is rarely preempted; one
  sharing them with a busy neighbour is preempted at every scheduler slice (a few ms),
  hundreds of times a second, and gets less CPU per second of step;
- the machine's busy cores (Σ per-core utilisation) against the process's own: what the
  rest of the machine took; steal time where the hypervisor reports it.

A step is *starved* when the process was preempted at least STARVED_SWITCHES_PER_CORE_S
times per second during it for each core it keeps busy (its threads are preempted one by
one: a process running 30 threads at once is preempted 30 times as often as one running
one, for the same contention), while the sampler saw other processes at work (at least
OTHERS_PRESENT_SHARE of the machine's cores); or when other processes held at least
OTHERS_SHARE of the cores while the machine was saturated. Every host threshold is a
share of the machine or of the process's own cores, so 0.25 cores of daemons or a
serving process's own oversubscribed threads on a 100-core GPU node are not contention.

Where the recorder read the stepping thread's run-queue wait (Linux schedstat,
probes/run_queue.py), that wait is the time lost, measured; the inference below is the
fallback for runs without it (older runs, kernels that do not account it).

A step computed on the CPU that ran longer than the step cost model explains by about
the CPU it did not get, without either sign, *waited for CPU* (`_waited_for_cpu`): an
inflation reason of its own, since without the sampler a wait for cores and a wait on
the disk look alike.

The time a starved step lost is estimated from the CPU it got: `wall − cpu / reference`,
the reference being the CPU per second of wall time the same kind of step (decode-only,
or with prefill) got when not starved — what the engine uses when it has the cores.

Probe stalls are the intervals in which a probe held the engine between steps (the
profiler starting or stopping: `probe` spans); steps recorded inside a profiler window
run slower for the profiler's own bookkeeping.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..traces.reader import Run
from .steady_state import INTERNAL
from .steptime import Stalls, StepTimeline

NS = 1e9
# Each busy thread preempted every 5 ms: a scheduler slice, sharing its core with runnable
# threads (per core the process keeps busy: _busy_cores).
STARVED_SWITCHES_PER_CORE_S = 200.0
STARVED_MIN_SWITCHES = 3  # and more than a stray preemption or two in a short step
OTHERS_SHARE = 0.25  # others hold a quarter of the machine's cores …
SATURATED = 0.9  # … while the machine is at least this busy
# Below this share of the machine's cores the sampler saw no other process at work (0.25
# cores on the 2-core machine it was set on; a 96-core node's daemons stay below 12).
OTHERS_PRESENT_SHARE = 0.125
MIN_REFERENCE_STEPS = 5
# A step that waited on a run queue for a tenth of its time is starved: the share at
# which host-contention warns (playbooks/triage.yaml), step by step.
STARVED_WAIT_SHARE = 0.1
# CPU per second of the stepping thread's running time above which the steps compute on
# several threads (its wait is then not the step's loss: _run_delay). One thread's clock
# plus the recorder's and sampler's own bits: tiny read 0.8-1.05 beside 0 to 3 burners,
# the 2-thread small preset 1.25-1.5 at little contention.
SINGLE_THREAD_CORES = 1.15
REASONS = (
    "probe",
    "JIT compile",
    "gc",
    "preemption",
    "host contention",
    "new shape",
    "CPU wait",
    "unexplained",
)


@dataclass(frozen=True)
class HostConditions:
    cores: int | None  # logical cores the sampler saw (None: no CPU samples)
    others_cores: float  # mean cores other processes used while the run ran (NaN: unknown)
    others_share: float  # others_cores / cores
    machine_busy_share: float  # mean busy share of the machine's cores
    process_cores: float  # mean cores the process used (sampler)
    steal_share: float  # mean share of CPU time stolen by the hypervisor (NaN: not reported)
    runnable: float  # mean runnable threads on the machine (Linux)
    step_cpu_ratio: float  # median CPU time per second of step
    reference_ratio: float  # the same, over steps that were not starved
    switches_per_s: float  # median involuntary context switches per second of step
    starved_steps: int
    starved_share: float  # share of step time in starved steps
    lost_s: float  # estimated step time lost to CPU starvation
    lost_share: float  # lost_s / Σ step time
    engine_busy_share: float  # Σ step time / the steps' span: how loaded the engine was
    run_queue_share: float  # the stepping thread's run-queue wait / Σ step time (NaN: not recorded)
    per_step: pd.DataFrame = field(metadata=INTERNAL)


@dataclass(frozen=True)
class ProbeStalls:
    count: int
    total_s: float
    largest_s: float
    names: tuple[str, ...]  # e.g. ("profiler_start 2.51 s", "profiler_stop 0.45 s")
    window_steps: tuple[int, int] | None  # the profiler window's steps, if one was recorded
    stalls: Stalls = field(metadata=INTERNAL)  # relative to the lifecycle's origin


@dataclass(frozen=True)
class Inflation:
    """What the run recorded at the inflated steps (the cost model's outliers)."""

    steps: int
    inflated_s: float
    by_reason_s: dict[str, float]  # REASONS → seconds of residual
    per_step: pd.DataFrame = field(metadata=INTERNAL)  # step_id, residual_s, reason


def host_conditions(
    run: Run, timeline: StepTimeline, cost_per_step: pd.DataFrame | None = None
) -> HostConditions | None:
    """None when the run recorded no per-step CPU evidence (older runs, imported traces)."""
    steps = run.steps
    if "cpu_time_ns" not in steps or steps["cpu_time_ns"].isna().all():
        return None
    s = steps.drop_duplicates("step_id").set_index("step_id").reindex(timeline.step_id)
    # Tensor parallelism: the time rank 0 sat in collectives (blocked on the other ranks)
    # and the CPU it spent there are the collectives' and the stragglers' (comm-share,
    # collective-wait); the host is judged on the rest of the step, where it computes.
    comm_wall, comm_cpu = _in_collectives(run, timeline.step_id)
    wall = np.maximum(timeline.end - timeline.start - comm_wall, 1.0)
    cpu = s["cpu_time_ns"].to_numpy("float64", na_value=np.nan) - comm_cpu
    switches = s["involuntary_switches"].to_numpy("float64", na_value=np.nan)
    ratio = cpu / wall
    rate = switches / (wall / NS)
    machine = _samples(run)
    cores = machine.cores
    others_at = _at_steps(machine.others, timeline.end + timeline.origin_ns)
    busy_at = _at_steps(machine.busy, timeline.end + timeline.origin_ns)
    crowded = (others_at >= OTHERS_SHARE * (cores or np.inf)) & (
        busy_at >= SATURATED * (cores or np.inf)
    )
    busy_cores = _busy_cores(ratio)
    preempted = (np.nan_to_num(rate) >= STARVED_SWITCHES_PER_CORE_S * busy_cores) & (
        np.nan_to_num(switches) >= STARVED_MIN_SWITCHES
    )
    # Preempted while the sampler saw no other process working: the engine's own threads
    # (and tensor-parallel ranks) outnumbered the cores. That is the engine's oversubscription,
    # not other processes taking its CPU.
    alone = others_at < OTHERS_PRESENT_SHARE * (cores or np.inf)
    preempted &= ~alone
    # Tensor-parallel ranks or data-parallel replicas share this host's cores and preempt
    # one another; without the sampler's view of other processes, a step's lack of CPU
    # says nothing about neighbours.
    own_crowd = _ranks_or_replicas(run) and not np.isfinite(others_at).any()
    if own_crowd:
        preempted[:] = False
    starved = preempted | crowded
    with_prefill = timeline.prefill_tokens > 0
    reference = _references(ratio, starved, with_prefill)
    deficit = wall - cpu / reference
    lost = np.where(starved & np.isfinite(cpu), np.maximum(deficit, 0.0), 0.0)
    # Where the stepping thread's run-queue wait was recorded, it is the time lost,
    # measured: no reference needed (a neighbour present for the whole run leaves no
    # unstarved step to infer one from). Waits with no other process at work are the
    # engine's own threads outnumbering the cores, not contention; without the sampler
    # nothing says whose they were (a run's own writer and client threads, 0-12 % of
    # step time in the same quiet runs), so the inference from the CPU decides there.
    delay = _run_delay(s, switches, cpu, wall)
    measured = np.isfinite(delay) & ~own_crowd & np.isfinite(others_at)
    from_others = measured & ~alone
    starved = np.where(measured, from_others & (delay >= STARVED_WAIT_SHARE * wall), starved)
    lost = np.where(measured, np.where(from_others, delay, 0.0), lost)
    waited = np.zeros(len(wall), bool)
    if cost_per_step is not None and not own_crowd and _computes_on_cpu(run):
        waited = _waited_for_cpu(timeline, deficit, cost_per_step) & ~alone & ~starved
    per_step = pd.DataFrame(
        {
            "step_id": timeline.step_id,
            "cpu_ratio": ratio,
            "switches_per_s": rate,
            "others_cores": others_at,
            "starved": starved,
            "waited_for_cpu": waited,
            "lost_s": lost / NS,
            "run_delay_s": delay / NS,
        }
    )
    return HostConditions(
        cores=cores,
        others_cores=_mean(machine.others),
        others_share=_mean(machine.others) / cores if cores else float("nan"),
        machine_busy_share=_mean(machine.busy) / cores if cores else float("nan"),
        process_cores=_mean(machine.process),
        steal_share=_mean(machine.steal),
        runnable=_mean(machine.runnable),
        step_cpu_ratio=float(np.nanmedian(ratio)) if np.isfinite(ratio).any() else float("nan"),
        reference_ratio=float(np.nanmedian(reference)),
        switches_per_s=float(np.nanmedian(rate)) if np.isfinite(rate).any() else float("nan"),
        starved_steps=int(starved.sum()),
        starved_share=float(wall[starved].sum() / wall.sum()) if wall.sum() else 0.0,
        lost_s=float(lost.sum() / NS),
        lost_share=float(lost.sum() / wall.sum()) if wall.sum() else 0.0,
        engine_busy_share=timeline.busy_share(),
        run_queue_share=float(np.nansum(delay) / wall.sum())
        if np.isfinite(delay).any() and wall.sum()
        else float("nan"),
        per_step=per_step,
    )


def _run_delay(
    steps: pd.DataFrame, switches: np.ndarray, cpu: np.ndarray, wall: np.ndarray
) -> np.ndarray:
    """Per step, the stepping thread's run-queue wait in ns, where it is the step's loss
    (NaN: not recorded, or not the loss). A run whose steps never waited although the
    kernel preempted the process is read as a kernel that does not account the wait
    (schedstat off), not as a run with no contention.

    The wait is the loss when the stepping thread does the step's work alone. A process
    that ran more than SINGLE_THREAD_CORES of CPU per second its stepping thread was not
    waiting computes on several threads: while one waits the others progress, and an
    intra-op thread spinning at a barrier is runnable without work to do (the small preset
    on 2 cores beside one burner: the thread waited 35 % of step time, the steps took 8 %
    longer). There the inference from the CPU the steps got decides."""
    if "run_delay_ns" not in steps:
        return np.full(len(steps), np.nan)
    delay = steps["run_delay_ns"].to_numpy("float64", na_value=np.nan)
    if np.nansum(delay) == 0 and np.nansum(switches) > 0:
        return np.full(len(steps), np.nan)
    if cpu_per_running_s(cpu, wall, delay) > SINGLE_THREAD_CORES:
        return np.full(len(steps), np.nan)
    return delay


def cpu_per_running_s(cpu: np.ndarray, wall: np.ndarray, wait: np.ndarray) -> float:
    """The process's CPU per second its stepping thread was not waiting on a run queue,
    over the steps where both are known: the cores the engine computes on (NaN: none)."""
    ok = np.isfinite(wait) & np.isfinite(cpu)
    running = float(np.sum(wall[ok] - wait[ok]))
    return float(np.sum(cpu[ok])) / running if running > 0 else float("nan")


def _busy_cores(ratio: np.ndarray) -> float:
    """The cores the process keeps busy when it runs unimpeded: the 90th percentile of its
    CPU per second of step (its busiest steps; contention only lowers it), at least one."""
    if not np.isfinite(ratio).any():
        return 1.0
    return max(float(np.nanpercentile(ratio, 90)), 1.0)


def _references(ratio: np.ndarray, starved: np.ndarray, with_prefill: np.ndarray) -> np.ndarray:
    """Each step's reference: the CPU per second of step its kind got when not starved."""
    reference = np.full(len(ratio), np.nan)
    overall = _reference(ratio, ~starved)
    for kind in (with_prefill, ~with_prefill):
        ref = _reference(ratio, kind & ~starved)
        reference[kind] = ref if np.isfinite(ref) else overall
    fallback = max(np.nanpercentile(ratio, 90), 1.0) if np.isfinite(ratio).any() else 1.0
    return np.where(np.isfinite(reference), reference, fallback)


def _waited_for_cpu(
    timeline: StepTimeline, deficit_ns: np.ndarray, cost_per_step: pd.DataFrame
) -> np.ndarray:
    """Steps computed on the CPU that ran longer than their batch explains (the step cost
    model's inflated steps) by about the CPU they did not get: at least half of the excess
    is wall time the process spent without its usual CPU. Its threads waited — for cores
    (a worker woken for each parallel op queued behind other processes while the rest
    waited at a barrier, which leaves no involuntary switch), or on the disk or a lock.
    Without the sampler's view the two cannot be told apart, so these steps are an
    inflation reason of their own ("CPU wait", after the probe, GC, preemption, starvation
    and new-shape reasons), not host contention."""
    cost = cost_per_step.set_index("step_id").reindex(timeline.step_id)
    inflated = cost["inflated"].fillna(False).to_numpy(bool)
    excess_ns = cost["residual_s"].fillna(0.0).to_numpy(np.float64) * NS
    return inflated & np.isfinite(deficit_ns) & (deficit_ns >= 0.5 * excess_ns)


def _computes_on_cpu(run: Run) -> bool:
    """Whether the engine's steps compute on the CPU (on a GPU, the host waiting for the
    device gets little CPU by design)."""
    from .run_config import engine_setting

    device = engine_setting(run.manifest.config, "device", None, "device")
    return str(device).startswith("cpu") if device else False


def _ranks_or_replicas(run: Run) -> bool:
    """Whether the engine ran as several ranks or replicas on this host."""
    from .run_config import section

    config = run.manifest.config
    sizes = (section(config, "parallel").get("tensor_parallel_size"),
             section(config, "data_parallel").get("size"))  # fmt: skip
    return any(isinstance(n, int) and n > 1 for n in sizes)


def _in_collectives(run: Run, step_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per step, the recording rank's wall and CPU time inside collectives (zeros without
    per-rank collectives). Runs recorded before collectives carried their CPU time give
    only the waiting for a later rank (blocked for certain) and no CPU."""
    from .collectives import collective_spans

    zeros = np.zeros(len(step_ids))
    if not len(run.spans) or not (run.spans["category"] == "comm").any():
        return zeros, zeros
    per_rank = collective_spans(run.spans)
    if not len(per_rank):
        return zeros, zeros
    mine = per_rank[per_rank["rank"] == per_rank["rank"].min()]
    cpu = mine["cpu_ns"].to_numpy(float)
    wall = np.where(
        np.isfinite(cpu), mine["dur_ns"].to_numpy(float), mine["wait_ns"].to_numpy(float)
    )
    by_step = pd.DataFrame({"step_id": mine["step_id"].to_numpy(), "wall": wall,
                            "cpu": np.nan_to_num(cpu)}).groupby("step_id").sum()  # fmt: skip
    by_step = by_step.reindex(step_ids).fillna(0.0)
    return by_step["wall"].to_numpy(float), by_step["cpu"].to_numpy(float)


def probe_stalls(run: Run, origin_ns: int) -> ProbeStalls:
    sp = run.spans
    sel = (sp["category"] == "probe").to_numpy() if len(sp) else np.zeros(0, bool)
    probes = sp[sel]
    start = (probes["start_ns"].to_numpy(np.int64) - origin_ns).astype(np.float64)
    end = start + probes["dur_ns"].to_numpy(np.float64)
    names = tuple(
        f"{n} {d / NS:.2f} s"
        for n, d in zip(probes["name"].astype(str), probes["dur_ns"].to_numpy(), strict=True)
    )
    window = (run.manifest.extra or {}).get("profiler_window") or {}
    captured = window.get("captured_steps")
    steps = (int(captured[0]), int(captured[1])) if captured else None
    stalls = Stalls(start, end)
    dur = end - start
    return ProbeStalls(len(probes), stalls.total / NS, float(dur.max() / NS) if len(dur) else 0.0,
                       names, steps, stalls)  # fmt: skip


def explain_inflation(
    run: Run,
    timeline: StepTimeline,
    per_step_cost: pd.DataFrame,
    host: HostConditions | None,
    probes: ProbeStalls,
) -> Inflation:
    """The first matching reason for each inflated step, in REASONS order: a probe held
    or profiled it, it JIT-compiled a kernel, garbage collection took at least half its
    residual, it preempted or swapped, the process was starved of CPU, it was the first
    step of its batch shape (new kernels, allocations), or nothing the run recorded."""
    cost = per_step_cost.reset_index(drop=True)
    inflated = cost["inflated"].to_numpy(bool)
    pos = np.flatnonzero(inflated)
    start, end = timeline.start[pos], timeline.end[pos]
    resid = cost["residual_s"].to_numpy()[pos]
    ids = timeline.step_id[pos]
    reason = np.full(len(pos), "unexplained", dtype=object)

    def claim(mask: np.ndarray, name: str) -> None:
        reason[(reason == "unexplained") & mask] = name

    in_window = np.zeros(len(pos), bool)
    if probes.window_steps is not None:
        lo, hi = probes.window_steps
        in_window = (ids >= lo) & (ids <= hi)
    claim(in_window | (probes.stalls.between(start, end) > 0), "probe")
    if timeline.compiled is not None:  # recorded by the Triton probe (jit_compile.py)
        claim(timeline.compiled[pos], "JIT compile")
    gc = _gc_time(run, timeline.origin_ns, start, end)
    claim(gc >= 0.5 * resid * NS, "gc")
    preempted = run.steps.drop_duplicates("step_id").set_index("step_id")["num_preempted"]
    claim(preempted.reindex(ids).fillna(0).to_numpy(np.float64) > 0, "preemption")
    if host is not None:
        claim(host.per_step["starved"].to_numpy(bool)[pos], "host contention")
    claim(_new_shape(timeline)[pos], "new shape")
    if host is not None:
        claim(host.per_step["waited_for_cpu"].to_numpy(bool)[pos], "CPU wait")
    frame = pd.DataFrame({"step_id": ids, "residual_s": resid, "reason": reason})
    by = frame.groupby("reason")["residual_s"].sum()
    return Inflation(
        steps=len(pos),
        inflated_s=float(resid.sum()),
        by_reason_s={r: float(by.get(r, 0.0)) for r in REASONS},
        per_step=frame.sort_values("residual_s", ascending=False, ignore_index=True),
    )


def _new_shape(timeline: StepTimeline) -> np.ndarray:
    """Steps whose decode batch size, or whose prefill token count above every earlier
    one, the run had not seen before."""
    d = pd.Series(timeline.decode_seqs)
    first_decode = ~d.duplicated().to_numpy() & (timeline.decode_seqs > 0)
    p = timeline.prefill_tokens
    prior_max = np.concatenate(([0.0], np.maximum.accumulate(p)[:-1]))
    return first_decode | (p > prior_max)


def _gc_time(run: Run, origin_ns: int, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    sp = run.spans
    if not len(sp) or not len(start):
        return np.zeros(len(start))
    gc = sp[(sp["category"] == "gc").to_numpy()]
    if not len(gc):
        return np.zeros(len(start))
    s = (gc["start_ns"].to_numpy(np.int64) - origin_ns).astype(np.float64)
    return Stalls(s, s + gc["dur_ns"].to_numpy(np.float64)).between(start, end)


def _reference(ratio: np.ndarray, mask: np.ndarray) -> float:
    ok = mask & np.isfinite(ratio)
    if ok.sum() < max(MIN_REFERENCE_STEPS, 0.05 * len(ratio)):
        return float("nan")
    return float(np.median(ratio[ok]))


@dataclass(frozen=True)
class _Samples:
    """The sampler's CPU counters, per sample time (None: not recorded)."""

    cores: int | None = None
    busy: pd.Series | None = None  # busy cores
    process: pd.Series | None = None  # the process's cores
    others: pd.Series | None = None  # busy − process, clipped at 0
    steal: pd.Series | None = None  # share of CPU time stolen
    runnable: pd.Series | None = None  # runnable threads on the machine


def _samples(run: Run) -> _Samples:
    c = run.counters
    if not len(c):
        return _Samples()
    name = c["name"].astype(str).to_numpy()

    def series(counter: str, scale: float, how: str = "mean") -> pd.Series | None:
        sel = c[name == counter]
        return sel.groupby("ts_ns")["value"].agg(how) / scale if len(sel) else None

    busy = series("cpu_util_pct", 100.0, "sum")
    process = series("process_cpu_pct", 100.0)
    others = None
    if busy is not None and process is not None:
        joined = pd.concat([busy, process], axis=1, keys=["busy", "proc"]).dropna()
        others = (joined["busy"] - joined["proc"]).clip(lower=0.0)
    cores = c[name == "cpu_util_pct"]["scope"].nunique() if busy is not None else None
    return _Samples(int(cores) if cores else None, busy, process, others,
                    series("cpu_steal_pct", 100.0), series("procs_running", 1.0))  # fmt: skip


def _mean(series: pd.Series | None) -> float:
    return float(series.mean()) if series is not None and len(series) else float("nan")


def _at_steps(series: pd.Series | None, t_ns: np.ndarray) -> np.ndarray:
    """The sample covering each time (the first sample at or after it: samples report
    the interval since the previous one)."""
    if series is None or not len(series):
        return np.full(len(t_ns), np.nan)
    ts = series.index.to_numpy(np.int64)
    at = np.searchsorted(ts, t_ns.astype(np.int64), side="left")
    ok = at < len(ts)
    out = np.full(len(t_ns), np.nan)
    out[ok] = series.to_numpy()[at[ok]]
    return out
