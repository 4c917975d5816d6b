"""`perfdiag import … --ray [ADDRESS]`: one Ray task per rank file, then the cross-rank
analysis on the tasks' per-rank summaries (traces/importers/ray_import.py,
analyzers/rank_summary.py), saved as the run's results/cross_rank.json."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from rich.table import Table

from .app import out
from .fit import fit
from .import_trace import files_summary
from .json_output import print_json

CROSS_RANK_FILE = "cross_rank.json"
SHOWN_RANKS = 16  # more ranks than this: the text shows those that waited most


def import_ray(traces, run: Path, *, address: str, parts_dir: Path | None, copy_raw: bool,
               ranks: list[int] | None, as_json: bool) -> None:  # fmt: skip
    from ..analyzers.rank_summary import RankSummary, cross_rank, summarize_part
    from ..traces.importers.ray_import import import_with_ray
    from ..traces.layout import RESULTS_DIR

    # Ray's own messages (a task that failed and is retried) go to stderr: stdout is the
    # command's output (--json).
    with contextlib.redirect_stdout(sys.stderr):
        s = import_with_ray(
            traces,
            run,
            address=address,
            parts_dir=parts_dir,
            command=["perfdiag", *sys.argv[1:]],
            copy_raw=copy_raw,
            ranks=ranks,
            per_rank=summarize_part,
        )
    cross = cross_rank(RankSummary.concat(s.per_rank))
    results = {
        "per_rank_summaries": "computed in the Ray tasks; compared here",
        "missing": s.missing,
        **cross.to_dict(),
    }
    (run / RESULTS_DIR).mkdir(exist_ok=True)
    (run / RESULTS_DIR / CROSS_RANK_FILE).write_text(json.dumps(results, indent=1) + "\n")
    for warning in s.warnings:
        print(f"perfdiag: warning: {warning}", file=sys.stderr)
    if as_json:
        print_json(_summary(s, cross))
        return
    _print(s, cross)


def _summary(s, cross) -> dict:
    return {
        "run": str(s.out),
        "files": files_summary(s.files),
        "missing": s.missing,
        "warnings": s.warnings,
        "events": s.events,
        "spans": s.spans,
        "seconds": round(s.seconds, 3),
        "events_per_s": round(s.events / s.seconds) if s.seconds else None,
        "ray": {
            "address": s.address or "local",
            "nodes": s.nodes,
            "tasks": len(s.files) + len(s.missing),
            "task_seconds": round(s.task_seconds, 3),
            "merge_seconds": round(s.merge_seconds, 3),
            "parts_dir": str(s.parts_dir) if s.parts_dir else None,
        },
        "cross_rank": cross.to_dict(),
    }


def _ms(ns) -> str:
    return f"{ns / 1e6:,.1f}"


def _print(s, cross) -> None:
    where = f"Ray at {s.address}" if s.address not in (None, "local") else "a local Ray cluster"
    out.print(
        f"[bold]imported[/] {s.events:,} events from {len(s.files)} rank file(s) into {s.out} "
        f"in {s.seconds:.2f} s, one task per file on {where} ({s.nodes} node(s))",
        highlight=False,
    )
    for m in s.missing:
        out.print(f"[red]missing[/] rank {m['rank']}: {m['path']} — {m['reason']}",
                  highlight=False)  # fmt: skip
    pr = cross.per_rank
    if not len(pr):
        return
    shown = pr if len(pr) <= SHOWN_RANKS else pr.nlargest(SHOWN_RANKS, "wait_ns")
    title = "ranks" if len(pr) <= SHOWN_RANKS else f"the {SHOWN_RANKS} ranks that waited most"
    t = Table(
        "rank",
        "windows",
        "busy ms",
        "idle %",
        "GPU idle ms",
        "collectives",
        "wait ms",
        "slowest steps",
        "entered last",
        title=title,
        title_justify="left",
    )
    for r in shown.sort_values("rank").itertuples():
        t.add_row(str(r.rank), str(r.windows), _ms(r.busy_ns), f"{100 * r.idle_share:.1f}",
                  _ms(r.gpu_idle_ns), str(r.collectives), _ms(r.wait_ns), str(r.slowest_steps),
                  str(r.last_in))  # fmt: skip
    out.print(fit(t, out))
    if cross.straggler_rank is not None:
        n = int(pr.loc[pr["rank"] == cross.straggler_rank, "slowest_steps"].iloc[0])
        out.print(f"straggler: rank {cross.straggler_rank}, slowest in {n} of "
                  f"{len(cross.stragglers)} steps", highlight=False)  # fmt: skip
    if cross.waited_for_rank is not None:
        n = int(pr.loc[pr["rank"] == cross.waited_for_rank, "last_in"].iloc[0])
        out.print(f"waited for: rank {cross.waited_for_rank}, last into {n} of "
                  f"{len(cross.collectives)} collectives", highlight=False)  # fmt: skip
    if cross.imbalance == cross.imbalance:
        out.print(f"busy-time imbalance across ranks: {cross.imbalance:.1%}", highlight=False)
    out.print(f"cross-rank results: {s.out / 'results' / CROSS_RANK_FILE}", highlight=False)
