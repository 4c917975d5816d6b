"""The driver's last step of a distributed run (probes/ray_load.py): each shard's part kept
under `parts/shard{k}/`, merged into the run, and the manifest told what happened — per
shard where it ran, its clock alignment, its health, or why it is missing."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from ..traces.manifest import COMPLETE, CRASHED, INTERRUPTED
from ..traces.reader import load_run
from ..traces.run_merge import append_part
from .client import Progress
from .shard_health import merged_health, send_lateness, shard_verdict

FAILED, CANCELLED = ("error", "rejected"), ("cancelled", "timeout")


def finish_run(writer, parts_dir: Path, outcomes, alignments, places, shares, http,
               interrupted: bool) -> tuple[str, Progress]:  # fmt: skip
    """Write the parts, merge them into `writer`'s run and close it: (status, progress).
    Raises ConfigError (leaving no run) when no shard recorded anything."""
    total = sum(len(s.planned) for s in shares)
    progress = Progress(total=total)
    shards, missing, health, first_config = [], {}, {}, None
    for k, outcome in enumerate(outcomes):
        files = outcome.get("files") or {}
        info = {"shard": k, **places[k], "requests": len(shares[k].planned),
                "concurrency": shares[k].concurrency,
                "clock": None if alignments[k] is None else alignments[k].record()}  # fmt: skip
        if "error" in outcome or not files or alignments[k] is None:
            why = outcome.get("error") or "the shard recorded nothing"
            missing[k] = why
            shards.append({**info, "status": "missing", "error": why})
            continue
        part = parts_dir / f"shard{k}"
        for rel, data in files.items():
            (part / rel).parent.mkdir(parents=True, exist_ok=True)
            (part / rel).write_bytes(data)
        run = load_run(part)
        first_config = first_config or run.manifest.config
        append_part(writer, part, k, alignments[k].offset_ns)
        _count(progress, run.requests)
        health[k] = shard_verdict(k, outcome.get("health"), _lateness(run.request_events))
        shards.append(
            {**info, "status": outcome.get("status"), "part": f"{parts_dir.name}/shard{k}"}
        )
    if first_config is None:
        writer.close(CRASHED)
        shutil.rmtree(writer.path, ignore_errors=True)  # the directory was empty: all ours
        reasons = "; ".join(f"shard {k}: {why}" for k, why in missing.items())
        raise ConfigError(f"no client shard recorded anything ({reasons})")
    present = [s for s in shards if s["status"] != "missing"]
    uncertainty = max(s["clock"]["uncertainty_ns"] for s in present)
    extra = {
        **writer.manifest.extra,
        "client_shards": {
            "count": len(outcomes),
            "ray_address": http.ray_address or "local",
            "placement": "SPREAD",
            "clock_uncertainty_ns": int(uncertainty),
            "missing": {str(k): why for k, why in missing.items()},
            "shards": shards,
        },
        "client_health": merged_health(health, sorted(missing)),
        # What the gate's parts-missing check reads (a --ray import's ranks write it too).
        "parts_missing": [
            {"part": f"client shard {k}", "reason": why} for k, why in missing.items()
        ],
    }
    config = {**writer.manifest.config, **{k: v for k, v in first_config.items()
                                            if k in ("target", "server")}}  # fmt: skip
    writer.update_manifest(config=config, extra=extra)
    statuses = {s["status"] for s in present}
    # A dead shard does not make the others' run partial: the gate says it is missing.
    status = COMPLETE if statuses == {COMPLETE} and not interrupted else INTERRUPTED
    writer.close(status)
    return status, progress


def _count(progress: Progress, requests) -> None:
    reason = requests["finish_reason"].astype("string")
    progress.done += len(requests)
    progress.sent += len(requests)
    progress.failed += int(reason.isin(FAILED).sum())
    progress.cancelled += int(reason.isin(CANCELLED).sum())
    progress.output_tokens += int(requests["output_tokens"].fillna(0).sum())


def _lateness(events) -> dict:
    """A shard's sends against its schedule, from its own events (one clock)."""
    client = events[(events["side"] == "client").to_numpy(bool)]
    due = client[(client["kind"] == "scheduled_send").to_numpy(bool)]
    made = client[(client["kind"] == "created").to_numpy(bool)]
    if not len(due):
        return send_lateness(np.zeros(0), np.zeros(0))
    both = due[["request_id", "ts_ns"]].merge(made[["request_id", "ts_ns"]], on="request_id",
                                              suffixes=("_due", "_made"))  # fmt: skip
    return send_lateness(both["ts_ns_due"].to_numpy(np.int64),
                         both["ts_ns_made"].to_numpy(np.int64))  # fmt: skip
