"""Roofline positions: arithmetic intensity, attained FLOP/s and bytes/s, the distance to
the ceilings and a bound class, for engine steps (analytic model) and for spans that
carry their own `flops`/`bytes` (Triton launches, profiler ops).

Bound class: the roof at intensity I is min(peak FLOP/s, I × bandwidth); work that
attains less than `LATENCY_FLOOR` of its roof is `latency` bound (launch, host,
synchronisation or tail effects: the roofline does not explain its time); otherwise it
is `compute` bound at or right of the ridge point (peak / bandwidth), else `bandwidth`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..hardware.ceilings import Ceilings, named, resolve
from ..traces.reader import Run, to_frame
from .jit_compile import compiled_launches
from .model_flops import ModelShape, StepShape, for_engine_config, step_totals
from .run_config import section

LATENCY_FLOOR = 0.25
_SPAN_COLUMNS = ("name", "category", "dur_ns", "flops", "bytes")


def position(flops, nbytes, seconds, ceilings: Ceilings, dtype: str) -> pd.DataFrame:
    """Roofline columns for work of `flops` and `nbytes` that took `seconds` (arrays)."""
    f = np.asarray(flops, np.float64)
    b = np.asarray(nbytes, np.float64)
    t = np.asarray(seconds, np.float64)
    peak, bw = ceilings.peak_flops(dtype), ceilings.bytes_per_s
    with np.errstate(divide="ignore", invalid="ignore"):
        intensity = f / b
        attained = f / t
        attained_bw = b / t
        roof = np.minimum(peak, intensity * bw)
        # Work without arithmetic (a copy: a KV store) is held to the bandwidth roof alone.
        of_roof = np.where((f == 0) & (b > 0), attained_bw / bw, attained / roof)
    bound = np.where(intensity >= peak / bw, "compute", "bandwidth").astype(object)
    bound[of_roof < LATENCY_FLOOR] = "latency"
    bound[~np.isfinite(of_roof)] = "unknown"
    return pd.DataFrame(
        {
            "flops": f,
            "bytes": b,
            "seconds": t,
            "intensity": intensity,
            "attained_flops_per_s": attained,
            "attained_bytes_per_s": attained_bw,
            "roof_flops_per_s": roof,
            "pct_of_roof": 100 * of_roof,
            "pct_of_peak_flops": 100 * attained / peak,
            "pct_of_peak_bandwidth": 100 * attained_bw / bw,
            "bound": bound,
        }
    )


def step_shapes(steps: pd.DataFrame, events: pd.DataFrame | None = None) -> StepShape:
    """Batch moments per engine step. The steps table gives totals; per-sequence prefill
    chunks come from `prefill_chunk` request events when the run has them (a chunk's
    cached context = the request's earlier chunks). Without them each prefill sequence
    is taken as an equal share of the step's prefill tokens with no cached context."""
    P = steps["num_prefill_seqs"].to_numpy(np.float64)
    N = steps["num_prefill_tokens"].to_numpy(np.float64)
    B = steps["num_decode_seqs"].to_numpy(np.float64)
    C = steps["num_context_tokens"].to_numpy(np.float64)  # Σ (context after the step)
    n = np.divide(N, P, out=np.zeros_like(N), where=P > 0)
    exact, full, pre_kv = P * n * (n + 1) / 2, P * n * n, N.copy()
    chunks = None
    if events is not None and len(events):
        chunks = events[(events["kind"].astype(str) == "prefill_chunk").to_numpy()]
        chunks = chunks[chunks["step_id"].notna() & chunks["num_tokens"].notna()]
    if chunks is not None and len(chunks):
        c = chunks.sort_values("ts_ns")[["request_id", "step_id", "num_tokens"]].copy()
        c["num_tokens"] = c["num_tokens"].astype("int64")
        c["ctx"] = c.groupby("request_id")["num_tokens"].cumsum() - c["num_tokens"]
        nn, cc = c["num_tokens"].to_numpy(np.float64), c["ctx"].to_numpy(np.float64)
        c = c.assign(ex=nn * cc + nn * (nn + 1) / 2, fu=nn * (cc + nn), kv=cc + nn)
        per = c.groupby("step_id")[["ex", "fu", "kv"]].sum()
        ids = steps["step_id"].to_numpy()
        have = np.isin(ids, per.index.to_numpy())
        got = per.reindex(ids[have])
        exact[have], full[have], pre_kv[have] = (
            got["ex"].to_numpy(),
            got["fu"].to_numpy(),
            got["kv"].to_numpy(),
        )
    decode_kv = np.maximum(C - pre_kv, B)
    last_chunk = P  # a sequence samples when its chunk ends the prompt: at most P per step
    return StepShape(N, exact, full, pre_kv, B, decode_kv, B + last_chunk)


def find_model_config(config: dict) -> dict | None:
    """The model configuration inside a run's resolved config (any nesting)."""
    if not isinstance(config, dict):
        return None
    if "hidden_size" in config and ("num_layers" in config or "num_hidden_layers" in config):
        return config
    for v in config.values():
        found = find_model_config(v) if isinstance(v, dict) else None
        if found:
            return found
    return None


def _run_dtype(config: dict) -> str:
    dtype = section(config, "engine_config").get("dtype") or section(config).get("dtype")
    return str(dtype or "bfloat16")


def run_gpu(run: Run) -> dict | None:
    """What the run recorded about its (first) GPU, or None."""
    gpus = run.manifest.environment.get("gpus") or []
    return gpus[0] if gpus and isinstance(gpus[0], dict) else None


def run_device(run: Run) -> str:
    """The device the run's work ran on: its first GPU's name; "gpu" for an imported
    trace with GPU spans but no device recorded (no deviceProperties: a recorded run's
    environment lists its GPUs, so there none means the CPU); else "cpu"."""
    gpu = run_gpu(run)
    if gpu is not None and gpu.get("name"):
        return str(gpu["name"])
    if gpu is not None:
        return "gpu"
    if run.manifest.source != "perfdiag":
        device = run.arrow("spans", ["device"]).column("device")  # one column, not the table
        if device.null_count < len(device):
            return "gpu"
    return "cpu"


@dataclass
class RooflineReport:
    ceilings: Ceilings
    dtype: str
    steps: pd.DataFrame  # per engine step (empty without a model config or steps)
    spans: pd.DataFrame  # per span name and category with flops/bytes (Triton launches, ops)
    model_note: str | None = None  # why a recorded model config gave no per-step roofline

    def to_dict(self) -> dict:
        return {
            "ceilings": self.ceilings.to_dict(),
            "dtype": self.dtype,
            "flops_dtype": self.ceilings.flops_dtype(self.dtype),  # the figure used
            "steps": _records(self.steps),
            "spans": _records(self.spans),
            "model_note": self.model_note,
        }


def _span_figures(run: Run) -> pd.DataFrame:
    """The span columns the roofline reads, not the whole cached table (which a timeline
    would hold, args and all, while its critical path runs: ~50 MB at 400k spans).
    `args` only where a Triton launch needs it (compiled_launches)."""
    spans = to_frame("spans", run.arrow("spans", list(_SPAN_COLUMNS)))
    if (spans["category"] == "triton").any():
        spans["args"] = to_frame("spans", run.arrow("spans", ["args"]))["args"]
    return spans


def _records(frame: pd.DataFrame) -> list[dict]:
    import json

    return json.loads(frame.to_json(orient="records")) if len(frame) else []


def roofline_report(
    run: Run,
    *,
    model: ModelShape | None = None,
    ceilings: Ceilings | None = None,
    ceilings_dir=None,
    dtype: str | None = None,
    causal: str = "exact",
    hardware: str | None = None,
) -> RooflineReport:
    """The run's roofline: per step from the analytic model (given, or found in the run's
    config) and per span kind from the spans' own figures. `hardware`: judge it against
    that device's datasheet (ceilings.named) instead of the one the run recorded."""
    config = run.manifest.config
    dtype = dtype or _run_dtype(config)
    if ceilings is None and hardware is not None:
        ceilings = named(hardware)
    ceilings = ceilings or resolve(run_device(run), ceilings_dir, gpu=run_gpu(run))
    note = None
    if model is None and (found := find_model_config(config)):
        try:
            model = ModelShape.from_dict(found, dtype=dtype)
        except (ValueError, TypeError, ArithmeticError) as e:  # a config edited or foreign
            note = f"the run's model config describes no model ({e})"[:300]
        engine = config.get("engine_config") if isinstance(config, dict) else None
        if model is not None and isinstance(engine, dict):  # --weights, --kv-dtype
            model = for_engine_config(model, engine)
    steps = pd.DataFrame()
    if model is not None and len(run.steps):
        s = run.steps
        flops, nbytes = step_totals(model, step_shapes(s, run.request_events), causal=causal)
        gpu = s["gpu_time_ns"].astype("float64").to_numpy()
        wall = (s["end_ns"] - s["start_ns"]).to_numpy(np.float64)
        seconds = np.where(np.isfinite(gpu) & (gpu > 0), gpu, wall) / 1e9
        steps = position(flops, nbytes, seconds, ceilings, dtype)
        steps.insert(0, "step_id", s["step_id"].to_numpy())
        steps.insert(1, "rank", s["rank"].array)
    spans = _span_figures(run)
    has = spans["flops"].notna() & spans["bytes"].notna() & (spans["dur_ns"] > 0)
    compiled = compiled_launches(spans)  # their events enclose a compile, not the kernel
    if compiled is not None:
        has &= ~compiled
    per_span = pd.DataFrame()
    if has.any():
        sub = spans[has.to_numpy()]
        g = (
            sub.assign(f=sub["flops"].astype("float64"), b=sub["bytes"].astype("float64"))
            .groupby(["name", "category"], observed=True, sort=False)
            .agg(count=("dur_ns", "size"), f=("f", "sum"), b=("b", "sum"), ns=("dur_ns", "sum"))
        )
        per_span = position(g["f"], g["b"], g["ns"] / 1e9, ceilings, dtype)
        per_span.insert(0, "name", g.index.get_level_values(0).astype(str))
        # how the time was taken: `triton` (CUDA events), `triton_interpret` (host, NumPy)…
        per_span.insert(1, "category", g.index.get_level_values(1).astype(str))
        per_span.insert(2, "count", g["count"].to_numpy())
    return RooflineReport(ceilings, dtype, steps, per_span, note)
