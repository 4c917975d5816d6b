"""The prefix cache's host tier (`--kv-offload-mb`): what its hits saved, whether restoring
beat recomputing, and whether the tier thrashed.

What the engine records (engine_ref/host_tier.py, probes/recorder.py), counters at the
step's start:
- per admission, scoped by the request id: `kv_hit_device_tokens`, `kv_hit_host_tokens`
  (the prefix hits by tier), and for a host hit `kv_restore_bytes`, `kv_restore_ns`
  (the host → device copy, measured around it);
- per step, scoped "host": `kv_offload_blocks` (device blocks copied down),
  `kv_offload_ns`, `kv_offload_evicted_unused` (host blocks evicted never restored),
  `kv_offload_blocks_used` (a gauge).
The time a recompute would have taken is the step-cost model's price of the restored
tokens as prefill tokens (`prefill_token_cost_s`: NaN when the fit cannot price them).
The break-even prefix length comes from a line fitted to restore time against restored
tokens (a per-copy cost plus a per-token cost): below it restoring costs more than
recomputing. A run without these counters has no host tier: nothing is inferred.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

ADMISSION = ("kv_hit_device_tokens", "kv_hit_host_tokens", "kv_restore_bytes", "kv_restore_ns")
TRAFFIC = (
    "kv_offload_blocks",
    "kv_offload_ns",
    "kv_offload_evicted_unused",
    "kv_offload_blocks_used",
)
COUNTERS = ADMISSION + TRAFFIC


@dataclass(frozen=True)
class OffloadSummary:
    admissions: int  # admissions with a prefix hit in either tier
    device_tokens: int
    host_tokens: int
    host_admissions: int  # admissions that restored from the host tier
    median_host_tokens: float  # per restoring admission
    restore_bytes: int
    restore_s: float
    recompute_s: float  # the restored tokens priced as prefill (NaN: no price)
    restore_fixed_s: float  # fitted per copy
    restore_token_s: float  # fitted per restored token
    recompute_token_s: float  # the cost model's price of one prefill token
    break_even_tokens: float  # restoring pays from this many tokens; inf: never; NaN: unknown
    slower_admissions: int  # restores that took longer than their recompute would have
    offloaded_blocks: int
    offload_s: float
    evicted_unused: int
    host_blocks_peak: int

    @property
    def net_saved_s(self) -> float:
        """Time the host tier's hits saved: recompute avoided minus the restores."""
        return self.recompute_s - self.restore_s

    @property
    def thrash_share(self) -> float:
        return self.evicted_unused / self.offloaded_blocks if self.offloaded_blocks else 0.0


def has_offload(run) -> bool:
    c = run.counters
    return bool(len(c)) and bool(c["name"].isin(COUNTERS).any())


def admissions(run) -> pd.DataFrame:
    """One row per admission with a recorded tier split: ts_ns, request_id and the four
    ADMISSION columns (0 where not recorded)."""
    c = run.counters
    c = c[c["name"].isin(ADMISSION).to_numpy()]
    if not len(c):
        return pd.DataFrame(columns=["ts_ns", "request_id", *ADMISSION])
    wide = c.pivot_table(index=["ts_ns", "scope"], columns="name", values="value", aggfunc="sum")
    wide = wide.reindex(columns=list(ADMISSION)).fillna(0.0).reset_index()
    return wide.rename(columns={"scope": "request_id"})


def summarize(run, prefill_token_cost_s: float) -> OffloadSummary | None:
    """The host tier's figures, or None when the run recorded none."""
    if not has_offload(run):
        return None
    a = admissions(run)
    host = a["kv_hit_host_tokens"].to_numpy(np.float64)
    dev = a["kv_hit_device_tokens"].to_numpy(np.float64)
    rns = a["kv_restore_ns"].to_numpy(np.float64) / 1e9
    restoring = host > 0
    price = float(prefill_token_cost_s)
    fixed, per_token = fit_restore_cost(host[restoring], rns[restoring])
    c = run.counters
    traffic = {n: c.loc[(c["name"] == n).to_numpy(), "value"].to_numpy() for n in TRAFFIC}
    return OffloadSummary(
        admissions=int(((host + dev) > 0).sum()),
        device_tokens=int(dev.sum()),
        host_tokens=int(host.sum()),
        host_admissions=int(restoring.sum()),
        median_host_tokens=float(np.median(host[restoring])) if restoring.any() else math.nan,
        restore_bytes=int(a["kv_restore_bytes"].sum()),
        restore_s=float(rns.sum()),
        recompute_s=float(host.sum() * price),
        restore_fixed_s=fixed,
        restore_token_s=per_token,
        recompute_token_s=price,
        break_even_tokens=break_even(fixed, per_token, price),
        slower_admissions=int((rns[restoring] > host[restoring] * price).sum()),
        offloaded_blocks=int(traffic["kv_offload_blocks"].sum()),
        offload_s=float(traffic["kv_offload_ns"].sum() / 1e9),
        evicted_unused=int(traffic["kv_offload_evicted_unused"].sum()),
        host_blocks_peak=int(traffic["kv_offload_blocks_used"].max(initial=0)),
    )


def fit_restore_cost(tokens: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """(seconds per restore, seconds per restored token) by least squares; with one
    distinct length, all of it per token. NaN without restores."""
    if not len(tokens):
        return math.nan, math.nan
    if len(np.unique(tokens)) < 2:
        return 0.0, float(seconds.sum() / tokens.sum())
    per_token, fixed = np.polyfit(tokens, seconds, 1)
    if fixed < 0:  # a negative per-copy cost is noise: all of it per token
        return 0.0, float(seconds.sum() / tokens.sum())
    return float(fixed), float(max(per_token, 0.0))


def break_even(fixed_s: float, token_s: float, recompute_token_s: float) -> float:
    """Prefix tokens from which restoring costs less than recomputing: fixed / (price −
    per-token restore); inf when a restored token costs at least a recomputed one."""
    if not all(map(math.isfinite, (fixed_s, token_s, recompute_token_s))):
        return math.nan
    if token_s >= recompute_token_s:
        return math.inf
    return fixed_s / (recompute_token_s - token_s)


def from_server(sm, prefill_token_cost_s: float) -> OffloadSummary | None:
    """The same figures from vLLM's own counters over the run (external_prefix_cache_* and
    kv_offload_*: analyzers/server_metrics.py), None when it exported no loads. The server
    says neither how many restores there were nor which blocks were evicted unused: the
    break-even uses a per-token restore cost only, and thrash is not evaluated."""
    c = sm.counters
    hits, load_s = c.get("external_prefix_hits"), c.get("offload_load_s")
    if not hits or load_s is None:
        return None
    price = float(prefill_token_cost_s)
    per_token = load_s / hits
    return OffloadSummary(
        admissions=0,
        device_tokens=int(c.get("prefix_hits", 0)),
        host_tokens=int(hits),
        host_admissions=0,
        median_host_tokens=math.nan,
        restore_bytes=int(c.get("offload_load_bytes", 0)),
        restore_s=float(load_s),
        recompute_s=float(hits * price),
        restore_fixed_s=0.0,
        restore_token_s=per_token,
        recompute_token_s=price,
        break_even_tokens=break_even(0.0, per_token, price),
        slower_admissions=0,
        offloaded_blocks=0,
        offload_s=float(c.get("offload_store_s", 0.0)),
        evicted_unused=0,
        host_blocks_peak=0,
    )
