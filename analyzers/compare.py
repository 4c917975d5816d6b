"""Two runs side by side (triage steps 6 and 7): what changed between them, how the
end-to-end metrics moved, and whether the outputs are still the same.

- `config_diff`: every setting that differs, as *variables*: an engine option, a workload
  field (the arrival's rate, cap and process separately), injected faults, a package or
  hardware difference, and the host's conditions (how much of the engine's step time
  other processes took, analyzers/host.py) when they differ by HOST_CHANGE. Measurement
  settings (probes) are listed apart — they change what is recorded, not what is
  measured — except a profiler window, which stalls the engine and so is a variable.
  Step 6 asks that one main variable changes.
- `metric_deltas`: percentiles of TTFT, TPOT, ITL and E2E with bootstrap confidence
  intervals on the difference B − A (requests resampled with replacement, each run on its
  own; ITL resamples whole requests with all their gaps, since a request's gaps are not
  independent). Seeded: the same runs give the same intervals.
- `trace_diff` (analyzers/trace_diff.py): per op and kernel, what was added, removed or
  changed in calls and time per step, when both runs hold spans.
- `correctness`: per request, the output digest of B against A (same request id, both
  ended normally), the mismatch rate, and log-probability differences where recorded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..traces.manifest import Manifest
from ..traces.reader import Run
from .findings import SEVERITIES, Triage, value_text
from .lifecycle import Missing
from .serving import ServingAnalysis
from .trace_diff import TraceDiff

# Workload fields that decide which requests a run sends (not when it sends them).
PROMPT_FIELDS = ("seed", "requests", "prompt_len", "output_len", "shared_prefix", "replay")
_ENV_KEYS = (
    "python",
    "implementation",
    "platform",
    "cpu_model",
    "cpu_count",
    "cuda_runtime",
    "hip_runtime",
    "gpus",
)
_WORKLOAD_SKIP = ("name", "description", "fit_to_context")  # fit_to_context: may, not did
PERTURBING_PROBES = ("profile_steps",)  # probe settings that change what the engine does
HOST_CHANGE = 0.1  # step time lost to other processes, as a share: a change this large counts


@dataclass(frozen=True)
class Change:
    name: str  # engine.chunk_size, workload.arrival.rate, environment.torch, …
    kind: str  # config | environment | measurement
    a: str
    b: str


@dataclass(frozen=True)
class ConfigDiff:
    changes: tuple[Change, ...]
    notes: tuple[str, ...]  # differences that are not variables (host name, a dirty tree)

    @property
    def variables(self) -> tuple[Change, ...]:
        """The main variables that changed: configuration and environment."""
        return tuple(c for c in self.changes if c.kind != "measurement")


def _show(value) -> str:
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def _flatten(data, prefix: str = "") -> dict[str, object]:
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, object] = {}
    for key, value in data.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        out.update(_flatten(value, name) if isinstance(value, dict) else {name: value})
    return out


def _diff(a: dict, b: dict, kind: str, prefix: str) -> list[Change]:
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if _show(va) != _show(vb):
            out.append(Change(f"{prefix}{key}", kind, _show(va), _show(vb)))
    return out


def _length_text(spec) -> object:
    """A token-length spec as `perfdiag run` writes it (`1024`, `uniform:16:64`,
    `lognormal:96:0.6:16:512`): a fixed length's unused bounds are not differences."""
    if not isinstance(spec, dict) or "kind" not in spec:
        return spec
    kind = spec["kind"]
    if kind == "fixed":
        return str(spec.get("value"))
    if kind == "uniform":
        return f"uniform:{spec.get('low')}:{spec.get('high')}"
    return (
        f"{kind}:{spec.get('median'):g}:{spec.get('sigma'):g}:{spec.get('low')}:{spec.get('high')}"
    )


def _workload_vars(w: dict) -> dict[str, object]:
    out = {k: v for k, v in w.items() if k not in _WORKLOAD_SKIP and k != "arrival"}
    for key in ("prompt_len", "output_len"):
        if key in out:
            out[key] = _length_text(out[key])
    for key, value in (w.get("arrival") or {}).items():  # rate, cap, process: separate knobs
        out[f"arrival.{key}"] = value
    return out


def config_diff(a: Manifest, b: Manifest, host_a=None, host_b=None) -> ConfigDiff:
    """`host_a`/`host_b`: each run's HostConditions (or None when not recorded)."""
    ra, rb = a.config.get("run_options"), b.config.get("run_options")
    changes: list[Change] = []
    if isinstance(ra, dict) and isinstance(rb, dict):
        changes += _diff(ra.get("engine") or {}, rb.get("engine") or {}, "config", "engine.")
        wa, wb = _workload_vars(ra.get("workload") or {}), _workload_vars(rb.get("workload") or {})
        changes += _diff(wa, wb, "config", "workload.")
        probes = [
            Change(c.name, "config" if c.name.split(".")[-1] in PERTURBING_PROBES else c.kind,
                   c.a, c.b)
            for c in _diff(ra.get("probes") or {}, rb.get("probes") or {}, "measurement",
                           "probes.")
        ]  # fmt: skip
        changes += probes
        # Injected faults (diagnosis experiments): an unset fault is the same as none.
        fa = {k: v for k, v in (a.config.get("faults") or {}).items() if v}
        fb = {k: v for k, v in (b.config.get("faults") or {}).items() if v}
        changes += _diff(fa, fb, "config", "faults.")
    elif _imported(a) and _imported(b):  # traces: the files are not a setting
        ia, ib = _trace_identity(a), _trace_identity(b)
        changes += _diff(ia, ib, "environment", "trace.")
        changes = [  # which rank was traced changes what is recorded, not the job
            Change(c.name, "measurement", c.a, c.b) if c.name == "trace.ranks" else c
            for c in changes
        ]
    else:  # not recorded by `perfdiag run`: every configuration leaf is a variable
        changes += _diff(_flatten(a.config), _flatten(b.config), "config", "config.")
    ea, eb = a.environment, b.environment
    env_a = {k: ea.get(k) for k in _ENV_KEYS} | (ea.get("packages") or {})
    env_b = {k: eb.get(k) for k in _ENV_KEYS} | (eb.get("packages") or {})
    env_a["perfdiag"], env_b["perfdiag"] = a.perfdiag_version, b.perfdiag_version
    notes = []
    env_a["gpus"], env_b["gpus"] = gpus_text(ea.get("gpus")), gpus_text(eb.get("gpus"))
    if env_a["gpus"] == env_b["gpus"] and _show(ea.get("gpus")) != _show(eb.get("gpus")):
        notes.append("the GPUs' recorded properties differ beyond name and memory (manifests)")
    if _imported(a) and _imported(b):
        ta, tb = (", ".join(map(str, m.config.get("traces") or [])) for m in (a, b))
        if ta != tb:
            notes.append(f"traces: A {ta}; B {tb}")
    rev_a, rev_b = (str(e.get("git_revision") or "") for e in (ea, eb))
    env_a["code revision"] = rev_a.removesuffix("-dirty")
    env_b["code revision"] = rev_b.removesuffix("-dirty")
    if rev_a != rev_b and env_a["code revision"] == env_b["code revision"]:
        notes.append(
            f"the source tree was {'dirty' if rev_a.endswith('-dirty') else 'clean'} "
            f"in A and {'dirty' if rev_b.endswith('-dirty') else 'clean'} in B"
        )
    changes += _diff(env_a, env_b, "environment", "environment.")
    changes += _host_change(host_a, host_b)
    if ea.get("hostname") != eb.get("hostname"):
        notes.append(f"recorded on {ea.get('hostname')} and {eb.get('hostname')}")
    return ConfigDiff(tuple(changes), tuple(notes))


def gpus_text(gpus) -> str | None:
    """A run's GPUs in a few words: "8 × NVIDIA A100-PG509-200 (39.6 GiB)", kinds joined
    by "+" (never the properties as JSON)."""
    if not isinstance(gpus, list) or not gpus:
        return None
    kinds: dict[str, int] = {}
    for g in gpus:
        g = g if isinstance(g, dict) else {"name": str(g)}
        mem = g.get("memory_bytes")
        size = f" ({mem / 2**30:.1f} GiB)" if isinstance(mem, int | float) and mem else ""
        key = f"{g.get('name') or 'unnamed GPU'}{size}"
        kinds[key] = kinds.get(key, 0) + 1
    return " + ".join(f"{n} × {k}" for k, n in kinds.items())


def _imported(m: Manifest) -> bool:
    return m.source != "perfdiag" or bool((m.extra or {}).get("kineto"))


def _trace_identity(m: Manifest) -> dict[str, object]:
    """What an imported trace says of its job: ranks, world size, backend and the
    profiler's versions from the trace header (keys naming a version)."""
    files = [f for f in ((m.extra or {}).get("kineto") or {}).get("files") or []
             if isinstance(f, dict)]  # fmt: skip
    out: dict[str, object] = {"importer": m.config.get("importer") or m.source}
    if not files:
        return out
    ranks = sorted({f.get("rank") for f in files}, key=lambda r: (r is None, r))
    out["ranks"] = ", ".join(str(r) for r in ranks)
    for key in ("world_size", "backend"):
        values = sorted({str(f.get(key)) for f in files if f.get(key) is not None})
        if values:
            out[key] = ", ".join(values)
    for f in files:
        for key, value in (f.get("header") or {}).items():
            if "version" in key.lower() and not isinstance(value, dict | list):
                out[key] = value
    return out


def _host_change(a, b) -> list[Change]:
    if a is None or b is None:
        return []
    la, lb = a.lost_share, b.lost_share
    if not (np.isfinite(la) and np.isfinite(lb)) or abs(lb - la) < HOST_CHANGE:
        return []

    def show(h) -> str:
        others = (
            "" if not np.isfinite(h.others_cores) else f", others used {h.others_cores:.1f} cores"
        )
        return f"{h.lost_share:.0%} of step time lost to other processes{others}"

    return [Change("host.cpu_contention", "environment", show(a), show(b))]


# -- metric deltas ---------------------------------------------------------------------------
@dataclass(frozen=True)
class MetricDelta:
    metric: str  # ttft.p50, itl.p99, throughput.output, …
    label: str
    unit: str  # ms | tokens/s | req/s
    a: float
    b: float
    delta: float  # b − a
    relative: float  # delta / a
    ci_low: float  # bootstrap interval of the delta (NaN: no interval)
    ci_high: float
    significant: bool  # the interval excludes 0
    verdict: str  # better | worse | same | unknown

    def texts(self) -> tuple[str, str, str, str, str]:
        """A, B, the delta, the relative change and the delta's interval as text, in the
        findings' number format, for every renderer (`perfdiag compare`, the TUI)."""
        interval = ""  # none: the verdict says "no interval"
        if self.ci_low == self.ci_low:
            interval = (
                f"[{value_text(self.ci_low, '', True)}, {value_text(self.ci_high, '', True)}]"
            )
        rel = "" if self.relative != self.relative else value_text(self.relative, "%", True)
        return (
            value_text(self.a),
            value_text(self.b),
            value_text(self.delta, "", signed=True),
            rel,
            interval,
        )


_PERCENTILE_METRICS = (
    ("ttft", "TTFT", "ttft_s", (50, 90, 99)),
    ("tpot", "TPOT", "tpot_s", (50, 99)),
    ("itl", "ITL", None, (50, 99)),
    # Each request's longest gap between tokens: the stall its stream showed. A spike in
    # under 1 % of all gaps (a long prompt's prefill stalling every decode once) leaves
    # ITL p99 unmoved yet reaches most requests.
    ("stall", "worst gap per request", None, (50, 90)),
    ("e2e", "E2E", "e2e_s", (50, 99)),
    ("due_e2e", "E2E from due", "due_e2e_s", (50, 99)),  # client waits included
)
# Every metric key `metric_deltas` reports: the targets an action may name.
METRIC_KEYS = (
    *(f"{key}.p{p}" for key, _, _, ps in _PERCENTILE_METRICS for p in ps),
    "throughput.output",
    "throughput.requests",
)


def percentile_metric(metric: str) -> tuple[str, str, int] | None:
    """A percentile metric key ("ttft.p50") as (values key, label, percentile); None for
    another key."""
    key, _, p = metric.rpartition(".p")
    for k, label, _, ps in _PERCENTILE_METRICS:
        if k == key and p.isdigit() and int(p) in ps:
            return k, f"{label} p{p}", int(p)
    return None


def request_values(s: ServingAnalysis) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    """Per metric: values and the request each belongs to (measured requests only)."""
    if isinstance(s.metrics, Missing):
        return None
    pr = s.metrics.per_request
    sel = pr["in_window"].to_numpy(bool)
    out = {}
    for key, _, column, _ in _PERCENTILE_METRICS:
        if column is None:
            continue
        v = pr[column].to_numpy("float64")[sel]
        ok = np.isfinite(v)
        out[key] = (v[ok], np.flatnonzero(sel)[ok])
    g = s.metrics.gaps
    gsel = sel[g["code"].to_numpy()] if len(g) else np.zeros(0, dtype=bool)
    out["itl"] = (g["gap_s"].to_numpy("float64")[gsel], g["code"].to_numpy()[gsel])
    worst = pd.Series(out["itl"][0]).groupby(out["itl"][1]).max()
    out["stall"] = (worst.to_numpy("float64"), worst.index.to_numpy())
    return out


def _bootstrap(values: np.ndarray, groups: np.ndarray, qs, n: int, rng) -> np.ndarray:
    """Percentiles `qs` of `n` resamples drawing whole groups (requests) with replacement:
    an (n, len(qs)) array."""
    if len(values) == 0:
        return np.full((n, len(qs)), np.nan)
    order = np.argsort(groups, kind="stable")
    values, groups = values[order], groups[order]
    starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
    lengths = np.diff(np.r_[starts, len(values)])
    out = np.empty((n, len(qs)))
    for i in range(n):
        pick = rng.integers(0, len(starts), len(starts))
        ln = lengths[pick]
        offsets = np.repeat(starts[pick] - np.r_[0, np.cumsum(ln)[:-1]], ln)
        out[i] = np.percentile(values[offsets + np.arange(ln.sum())], qs)
    return out


def metric_deltas(
    a: ServingAnalysis, b: ServingAnalysis, n_boot: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[MetricDelta, ...]:
    va, vb = request_values(a), request_values(b)
    if va is None or vb is None:
        return ()
    rng = np.random.default_rng(seed)
    lo_q, hi_q = 50 * (1 - level), 50 * (1 + level)
    out = []
    for key, label, _, percentiles in _PERCENTILE_METRICS:
        (xa, ga), (xb, gb) = va[key], vb[key]
        diffs = _bootstrap(xb, gb, percentiles, n_boot, rng) - _bootstrap(
            xa, ga, percentiles, n_boot, rng
        )
        for j, p in enumerate(percentiles):
            pa = float(np.percentile(xa, p)) if len(xa) else np.nan
            pb = float(np.percentile(xb, p)) if len(xb) else np.nan
            ok = diffs[:, j][np.isfinite(diffs[:, j])]
            lo, hi = np.percentile(ok, [lo_q, hi_q]) if len(ok) else (np.nan, np.nan)
            out.append(
                make_delta(
                    f"{key}.p{p}",
                    f"{label} p{p}",
                    "ms",
                    pa * 1e3,
                    pb * 1e3,
                    lo * 1e3,
                    hi * 1e3,
                    lower_is_better=True,
                )
            )
    for key, label, unit, get in (
        ("throughput.output", "output throughput", "tokens/s", lambda t: t.output_tokens_per_s),
        ("throughput.requests", "request throughput", "req/s", lambda t: t.requests_per_s),
    ):
        ta, tb = get(a.metrics.throughput), get(b.metrics.throughput)
        out.append(make_delta(key, label, unit, ta, tb, np.nan, np.nan, lower_is_better=False))
    return tuple(out)


def make_delta(metric, label, unit, a, b, lo, hi, lower_is_better: bool) -> MetricDelta:
    delta = b - a
    significant = bool(np.isfinite(lo) and np.isfinite(hi) and (lo > 0 or hi < 0))
    if not np.isfinite(delta):
        verdict = "unknown"
    elif not np.isfinite(lo):
        verdict = "unknown" if delta else "same"
    elif not significant:
        verdict = "same"
    else:
        verdict = "better" if (delta < 0) == lower_is_better else "worse"
    rel = delta / a if a and np.isfinite(a) else float("nan")
    return MetricDelta(
        metric,
        label,
        unit,
        float(a),
        float(b),
        float(delta),
        float(rel),
        float(lo),
        float(hi),
        significant,
        verdict,
    )


# -- correctness -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Correctness:
    comparable: bool
    reason: str  # why not comparable, or what was compared
    compared: int  # requests that ended normally in both runs
    mismatched: int
    mismatch_rate: float
    length_mismatched: int  # of the mismatches, those whose output lengths differ
    mismatched_ids: tuple[str, ...]
    logprobs: str  # what the log-probability check could do
    max_logprob_diff: float


def correctness(a: Run, b: Run) -> Correctness:
    wa = (a.manifest.config.get("run_options") or {}).get("workload")
    wb = (b.manifest.config.get("run_options") or {}).get("workload")
    if isinstance(wa, dict) and isinstance(wb, dict):
        differ = [k for k in PROMPT_FIELDS if _show(wa.get(k)) != _show(wb.get(k))]
        if differ:
            reason = f"the runs send different requests (workload {', '.join(differ)} differ)"
            return Correctness(False, reason, 0, 0, float("nan"), 0, (), "not compared", np.nan)
    cols = ["request_id", "finish_reason", "output_tokens", "output_digest", "args"]
    ra, rb = a.requests[cols], b.requests[cols]
    pairs = ra.merge(rb, on="request_id", suffixes=("_a", "_b"))
    ok = (
        pairs["finish_reason_a"].isin(["stop", "length"]).to_numpy()
        & pairs["finish_reason_b"].isin(["stop", "length"]).to_numpy()
    )
    ok &= pairs["output_digest_a"].notna().to_numpy() & pairs["output_digest_b"].notna().to_numpy()
    pairs = pairs[ok]
    if not len(pairs):
        return Correctness(
            False,
            "no request ended normally in both runs with an output digest",
            0,
            0,
            float("nan"),
            0,
            (),
            "not compared",
            np.nan,
        )
    differs = (pairs["output_digest_a"] != pairs["output_digest_b"]).to_numpy()
    lengths = (pairs["output_tokens_a"] != pairs["output_tokens_b"]).to_numpy(bool, na_value=False)
    logprobs, max_diff = _logprob_diff(pairs)
    ids = tuple(pairs["request_id"].astype(str).to_numpy()[differs][:10])
    n = len(pairs)
    return Correctness(
        True,
        f"{n} requests that ended normally in both runs",
        n,
        int(differs.sum()),
        float(differs.mean()),
        int((differs & lengths).sum()),
        ids,
        logprobs,
        max_diff,
    )


def _logprob_diff(pairs: pd.DataFrame) -> tuple[str, float]:
    """|Δ| of a request's summed output log-probability, where both runs recorded one
    (`args.cumulative_logprob`)."""

    def read(text) -> float:
        try:
            value = json.loads(text).get("cumulative_logprob") if isinstance(text, str) else None
        except (json.JSONDecodeError, AttributeError):
            value = None
        return float(value) if isinstance(value, int | float) else np.nan

    la = np.array([read(t) for t in pairs["args_a"]])
    lb = np.array([read(t) for t in pairs["args_b"]])
    both = np.isfinite(la) & np.isfinite(lb)
    if not both.any():
        return "not recorded", float("nan")
    diff = np.abs(la[both] - lb[both])
    return f"{int(both.sum())} requests: max |Δ| {diff.max():.3g}", float(diff.max())


# -- findings that appeared or disappeared ---------------------------------------------------
@dataclass(frozen=True)
class FindingChange:
    check: str
    title: str
    status: str  # appeared | disappeared | worse | better
    severity_a: str | None
    severity_b: str | None


def finding_changes(a: Triage, b: Triage) -> tuple[FindingChange, ...]:
    """Warnings and critical findings in one triage and not the other, or at another
    severity (the data-trust gate included; steps 6 and 7 left out: they compare)."""

    def index(t: Triage) -> dict:
        return {f.check: f for f in t.findings if f.severity != "info" and f.step < 6}

    fa, fb = index(a), index(b)
    out = []
    for check in [*fa, *(c for c in fb if c not in fa)]:
        x, y = fa.get(check), fb.get(check)
        if x is None or y is None:
            out.append(
                FindingChange(
                    check,
                    (y or x).title,
                    "appeared" if x is None else "disappeared",
                    x and x.severity,
                    y and y.severity,
                )
            )
        elif x.severity != y.severity:
            worse = SEVERITIES.index(y.severity) > SEVERITIES.index(x.severity)
            out.append(
                FindingChange(
                    check, y.title, "worse" if worse else "better", x.severity, y.severity
                )
            )
    return tuple(out)


@dataclass(frozen=True)
class Comparison:
    run_a: str
    run_b: str
    diff: ConfigDiff
    deltas: tuple[MetricDelta, ...]
    correctness: Correctness
    findings: tuple[FindingChange, ...]
    triage: Triage  # run B's triage against A as its baseline (steps 6 and 7 included)
    trace: TraceDiff | None = None  # the spans' diff, when both runs hold a trace
