"""What differs between two runs' settings (triage step 6 asks that one main variable
changes): engine options, workload fields, injected faults, packages and hardware, and
the host's conditions, each a `Change`; probe settings apart, as measurement."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ..traces.manifest import Manifest

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
        # A server perfdiag launched: its arguments are its settings (vLLM's flags).
        changes += _diff(_launch_args(a), _launch_args(b), "config", "server.")
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


def _launch_args(m: Manifest) -> dict:
    """The launched server's parsed arguments, less the free port each launch picks."""
    launch = (m.config.get("server") or {}).get("launch")
    args = launch.get("args") if isinstance(launch, dict) else None
    return {k: v for k, v in args.items() if k != "port"} if isinstance(args, dict) else {}


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
