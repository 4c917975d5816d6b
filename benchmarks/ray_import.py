"""Many-rank import: `perfdiag import DIR --ray` against the serial `perfdiag import DIR`
and HTA 0.5.0's multi-rank parse (`TraceAnalysis(trace_dir=DIR)`, its own process pool),
at 8, 16, 32 and 64 ranks (issue 40).

Rank files: benchmarks/make_rank_traces.py (the two real ranks of tests/data/kineto's
sampled job, ~4,800 events each, shifted per rank). Each tool runs as a user runs it, a
whole process from fork to exit, interleaved per rank count:

- serial: `perfdiag import DIR -o RUN` (one process; each file in turn);
- serial + analysis: the same import, then the per-rank summaries and the cross-rank
  analysis --ray computes, on the merged run, in one process (what --ray does, no Ray);
- ray (cold): `perfdiag import DIR -o RUN --ray`: starts a local Ray cluster (ray.init),
  one task per file, merges, shuts the cluster down;
- ray (warm): the same against a running local cluster (`--ray-address`, one node with
  one CPU per core, started once before the rounds): the cost without Ray's start;
- HTA: `TraceAnalysis(trace_dir=DIR)` in build/hta-venv (see kineto_vs_hta.py).

Wall time: fork to exit. Memory: the peak of the process tree's summed PSS (a page two
processes share counts half in each), sampled every 50 ms: for a cold Ray run the tree
holds Ray's own daemons (GCS, raylet) and its workers; for a warm run only the CLI
(the cluster's processes are not its children; their PSS is reported apart, measured
once while idle). At 64 ranks the Ray run's tables are checked equal to the serial run's.

    flock /tmp/perfdiag-cpu.lock .venv/bin/python benchmarks/ray_import.py [--ranks 8 16 32 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]

from kineto_vs_hta import HTA_CHILD, _descendants, _pss_kb, hta_python, machine  # noqa: E402
from make_rank_traces import make_rank_traces  # noqa: E402

# The serial import followed by the same per-rank summaries and cross-rank analysis,
# on the merged run, in one process: what --ray computes, without Ray.
SERIAL_ANALYSIS = """
import sys
from pathlib import Path
from perfdiag.analyzers.rank_summary import cross_rank, summarize
from perfdiag.analyzers.spans import timeline_spans
from perfdiag.traces.importers.kineto import import_kineto
from perfdiag.traces.importers.trace_files import trace_files
from perfdiag.traces.reader import load_run
import_kineto(trace_files([Path(sys.argv[1])]), sys.argv[2])
run = load_run(sys.argv[2])
cross_rank(summarize(timeline_spans(run), run.steps))
"""


def run_tree(argv: list, env: dict | None = None) -> dict:
    """Run to the end: wall s, the tree's peak summed PSS (MB), its stdout."""
    t = time.perf_counter()
    proc = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    peak = 0
    while proc.poll() is None:
        peak = max(peak, sum(_pss_kb(p) for p in [proc.pid, *_descendants(proc.pid)]))
        time.sleep(0.05)
    out, err = proc.communicate()
    secs = time.perf_counter() - t
    if proc.returncode:
        raise SystemExit(f"{' '.join(map(str, argv[:6]))} failed: {err[-2000:]}")
    return {"s": secs, "mb": peak / 1024, "out": out}


def same_tables(a: Path, b: Path) -> bool:
    from perfdiag.traces.reader import load_run

    ra, rb = load_run(a), load_run(b)
    names = ("spans", "counters", "requests", "request_events", "steps")
    return all(ra.arrow(n).equals(rb.arrow(n)) for n in names)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[8, 16, 32, 64])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--no-hta", action="store_true")
    a = p.parse_args()
    from ray_cluster import start_cluster

    hta_py = None if a.no_hta else hta_python()
    cli = [sys.executable, "-m", "perfdiag", "import"]
    print(machine())
    cluster = start_cluster(num_nodes=1, cpus_per_node=max(1, len(_cores())))
    try:
        idle_mb = sum(_pss_kb(n.pid) + sum(_pss_kb(d) for d in _descendants(n.pid))
                      for n in cluster.nodes) / 1024  # fmt: skip
        env = cluster.subprocess_env()
        rows = []
        with tempfile.TemporaryDirectory(prefix="ray_import_bench_") as tmp:
            tmp = Path(tmp)
            for n in a.ranks:
                ranks = tmp / f"r{n}"
                make_rank_traces(ranks, n)
                events = None
                res: dict[str, list] = {
                    "serial": [],
                    "analysed": [],
                    "cold": [],
                    "warm": [],
                    "hta": [],
                }
                for r in range(a.rounds):
                    out = tmp / f"{n}-{r}"
                    res["serial"].append(run_tree([*cli, ranks, "-o", out / "serial", "--json"]))
                    events = json.loads(res["serial"][-1]["out"])["events"]
                    res["analysed"].append(run_tree([sys.executable, "-c", SERIAL_ANALYSIS, ranks,
                                                     out / "analysed"]))  # fmt: skip
                    res["cold"].append(run_tree([*cli, ranks, "-o", out / "cold", "--ray",
                                                 "--json"]))  # fmt: skip
                    res["warm"].append(run_tree([*cli, ranks, "-o", out / "warm", "--ray",
                                                 "--ray-address", cluster.address, "--json"],
                                                env=env))  # fmt: skip
                    if hta_py is not None:
                        res["hta"].append(run_tree([hta_py, "-c", HTA_CHILD, ranks]))
                    if n == max(a.ranks) and r == 0:
                        for kind in ("cold", "warm"):
                            assert same_tables(out / kind, out / "serial"), kind
                        print(f"{n} ranks: the Ray runs' tables equal the serial run's")
                warm = [json.loads(x["out"]) for x in res["warm"]]
                task_s = statistics.median(w["ray"]["task_seconds"] for w in warm)
                merge_s = statistics.median(w["ray"]["merge_seconds"] for w in warm)
                row = {"ranks": n, "events": events, "task_s": task_s, "merge_s": merge_s}
                for k, v in res.items():
                    if v:
                        row[f"{k}_s"] = statistics.median(x["s"] for x in v)
                        row[f"{k}_mb"] = max(x["mb"] for x in v)
                rows.append(row)
                print(json.dumps(row), flush=True)
        _table(rows, idle_mb)
    finally:
        cluster.stop()


def _cores() -> list[int]:
    import os

    return sorted(os.sched_getaffinity(0))


def _table(rows: list[dict], idle_mb: float) -> None:
    print(f"\nwall s (peak MB, process tree's summed PSS); warm cluster idle: {idle_mb:.0f} MB")
    print(f"{'ranks':>5} {'events':>9} {'serial':>14} {'+analysis':>14} {'ray cold':>14} "
          f"{'ray warm':>14} {'HTA':>14} {'tasks s':>8} {'merge s':>8}")  # fmt: skip
    for r in rows:
        cells = []
        for k in ("serial", "analysed", "cold", "warm", "hta"):
            cells.append(f"{r[k + '_s']:6.2f} ({r[k + '_mb']:4.0f})" if k + "_s" in r else "-")
        print(f"{r['ranks']:>5} {r['events']:>9,} " + " ".join(f"{c:>14}" for c in cells)
              + f" {r['task_s']:>8.2f} {r['merge_s']:>8.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
