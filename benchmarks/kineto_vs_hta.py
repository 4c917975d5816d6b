"""perfdiag's Kineto import + timeline against HTA 0.5.0's TraceAnalysis parse, on the same
files, interleaved, each in a fresh interpreter (issue 16); with --decoders, the JSON
decoders that could replace the stdlib one, on the same text (msgspec was chosen so).

HTA and the decoders live in their own environment (build/hta-venv, made here on first
use from PyPI) so they cannot disturb perfdiag's. Traces: the real V100 training
trace (68,692 events) and the same trace's events repeated K times (times shifted past
the previous copy, correlation/flow/External ids and step numbers offset): a real
trace's content at 100k–1M events.

Peak memory: each tool's largest of its own high-water resident set (VmHWM) in the timed
rounds and, from one more untimed round, the peak of its process tree's summed
proportional set sizes (PSS: a page shared by two processes, as a fork's are, counts
half in each), sampled every 10 ms. The tree counts when a tool runs processes of its
own: HTA's pool, perfdiag's helper that reads a large trace's tail.

As the CLI is used (issue 36): whole processes, interleaved — HTA's `python -c` (its
import and parse) against `perfdiag import TRACE -o RUN --timeline` (import and timeline
in one process, as a user asks for both) and, printed apart, `perfdiag import TRACE -o
RUN` then `perfdiag timeline RUN` (two processes); the critical path on, its default;
each process's wall time from fork to exit (interpreter start and imports included) and
its peak resident set (wait4's ru_maxrss: the largest process of its tree); the ratio per
round and its median, beside the in-process figures, whose timeline includes the
critical path as `timeline` runs it.

    .venv/bin/python benchmarks/kineto_vs_hta.py [--rounds 3] [--repeat 6 15] [--decoders]
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
V100 = ROOT / "tests/data/kineto/v100_train_ns_resolution.json.gz"
HTA_VENV = ROOT / "build/hta-venv"
HTA_PACKAGES = ["holistictraceanalysis==0.5.0", "orjson", "msgspec", "pysimdjson", "duckdb"]

# Peak memory: the process's own high-water mark (VmHWM, reset at exec; ru_maxrss is not:
# a child would report its parent's peak), and its children's largest ru_maxrss apart.
HWM = r"""
def hwm_mb():
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmHWM:")) / 1024
"""

HTA_CHILD = (
    HWM
    + r"""
import json, logging, resource, sys, time
logging.disable(logging.WARNING)
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
t1 = time.perf_counter()
TraceAnalysis(trace_dir=sys.argv[1])
t2 = time.perf_counter()
r = resource.getrusage
print(json.dumps({"imports_s": t1 - t0, "parse_s": t2 - t1,
                  "rss_mb": hwm_mb(),
                  "children_rss_mb": r(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""
)

PERFDIAG_CHILD = (
    HWM
    + r"""
import json, resource, sys, time
t0 = time.perf_counter()
from perfdiag.traces.importers.kineto import import_kineto
from perfdiag.traces.reader import load_run
from perfdiag.analyzers.report import report_from_spans
from perfdiag.analyzers.spans import timeline_spans
from perfdiag.analyzers.critical_path import critical_path
t1 = time.perf_counter()
s = import_kineto([sys.argv[1]], sys.argv[2])
t2 = time.perf_counter()
run = load_run(sys.argv[2])
df = timeline_spans(run)  # one read for both, as `perfdiag timeline` does
rep = report_from_spans(df, run.steps)
t3 = time.perf_counter()
critical_path(df, rep.windows)  # as `perfdiag timeline` runs it (on by default)
t4 = time.perf_counter()
r = resource.getrusage
meta = load_run(sys.argv[2]).manifest.extra["kineto"]["files"][0]
assert meta["front_end"] == "fast", meta["front_end"]  # the fast front end read it
print(json.dumps({"imports_s": t1 - t0, "import_s": t2 - t1, "timeline_s": t4 - t2,
                  "critical_path_s": t4 - t3,
                  "events": s.events, "spans": rep.spans, "workers": meta["workers"],
                  "rss_mb": hwm_mb(),
                  "children_rss_mb": r(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""
)

DECODERS_CHILD = r"""
import gzip, json, sys, time
text = gzip.open(sys.argv[1], "rt").read()
raw = text.encode()
out = {}
def timed(name, fn):
    try:
        t = time.perf_counter(); n = fn(); out[name] = [time.perf_counter() - t, n]
    except Exception as e:
        out[name] = [None, f"{type(e).__name__}: {e}"[:120]]
timed("json (stdlib) loads", lambda: len(json.loads(text)["traceEvents"]))
import orjson
timed("orjson loads", lambda: len(orjson.loads(raw)["traceEvents"]))
import msgspec
timed("msgspec decode (generic)", lambda: len(msgspec.json.decode(raw)["traceEvents"]))
class Ev(msgspec.Struct):
    ph: str = ""
    name: str = ""
    cat: str = ""
    ts: float | str | None = None
    dur: float | str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    id: int | str | None = None
    args: msgspec.Raw = msgspec.Raw(b"{}")
class Doc(msgspec.Struct):
    traceEvents: list[Ev]
timed("msgspec typed (args kept raw)", lambda: len(msgspec.json.decode(raw, type=Doc).traceEvents))
import simdjson
def simd():
    doc = simdjson.Parser().parse(raw)
    n = 0
    for e in doc["traceEvents"]:  # touch the fields an importer reads
        e.get("ph"); e.get("name"); e.get("ts"); e.get("dur"); e.get("cat"); n += 1
    return n
timed("pysimdjson parse + fields", simd)
import duckdb
def duck():
    q = ("select count(*) from (select unnest(traceEvents) from "
         f"read_json('{sys.argv[1]}', maximum_object_size=2000000000))")
    return duckdb.connect().execute(q).fetchone()[0]
timed("duckdb read_json (gz, unnest)", duck)
print(json.dumps(out))
"""


def machine() -> str:
    from perfdiag.traces.environment import cpu_model

    return (f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip


def hta_python() -> Path:
    py = HTA_VENV / "bin/python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(HTA_VENV)], check=True)
    have = subprocess.run([str(py), "-c", "import hta, orjson, msgspec, simdjson, duckdb"],
                          capture_output=True)  # fmt: skip
    if have.returncode:
        print(f"installing {', '.join(HTA_PACKAGES)} into {HTA_VENV} …", flush=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *HTA_PACKAGES], check=True)
    return py


_FLOAT = "\x00f:"  # marks a float's text through json.dump, to be written unquoted


def _ns(text) -> int:
    whole, _, frac = str(text).removeprefix(_FLOAT).partition(".")
    return int(whole) * 1000 + int((frac + "000")[:3]) if frac else int(whole) * 1000


def repeated(src: Path, k: int, dst: Path) -> int:
    """The trace's events k times over, each copy after the last (ids offset). Times keep
    Kineto's exact "µs.ns" text: each copy's ts is shifted by whole ns."""
    with gzip.open(src, "rt") as f:
        doc = json.load(f, parse_float=lambda s: _FLOAT + s)
    events = doc["traceEvents"]
    ts = [_ns(e["ts"]) for e in events if "ts" in e]
    span = max(ts) - min(ts) + 1_000_000
    out = []
    for c in range(k):
        for e in events:
            e = dict(e)
            if c and "ts" in e:
                ns = _ns(e["ts"]) + c * span
                e["ts"] = f"{_FLOAT}{ns // 1000}.{ns % 1000:03d}"
            if c and isinstance(e.get("id"), int):
                e["id"] = e["id"] + c * 10_000_000
            args = e.get("args")
            if c and isinstance(args, dict):
                args = dict(args)
                for key in ("correlation", "External id"):
                    if isinstance(args.get(key), int):
                        args[key] += c * 10_000_000
                e["args"] = args
            name = e.get("name")
            if c and isinstance(name, str) and name.startswith("ProfilerStep#"):
                e["name"] = f"ProfilerStep#{int(name[13:]) + c * 1000}"
            out.append(e)
    doc["traceEvents"] = out
    text = re.sub(r'"\\u0000f:([-0-9.eE+]+)"', r"\1", json.dumps(doc))
    with gzip.open(dst, "wt", compresslevel=6) as f:
        f.write(text)
    return len(out)


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next((int(x.split()[1]) for x in f if x.startswith("Pss:")), 0)
    except OSError:  # it has just ended
        return 0


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    kids = [int(x) for x in f.read().split()]
                out += kids
                todo += kids
        except OSError:
            continue
    return out


def run_child(py, code: str, *args, tree: bool = False) -> dict:
    """Run a child to its end: its JSON line. `tree`: also `tree_mb`, the peak of its
    process tree's summed PSS, sampled every 10 ms (the sampling costs CPU: an untimed
    round's)."""
    proc = subprocess.Popen([str(py), "-c", code, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    peak = 0
    while tree and proc.poll() is None:
        peak = max(peak, sum(_pss_kb(p) for p in [proc.pid, *_descendants(proc.pid)]))
        time.sleep(0.01)
    out, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"child failed: {err[-2000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    result["tree_mb"] = peak / 1024
    return result


def run_process(argv: list, log: Path) -> tuple[float, float]:
    """A whole process, as a user runs it: its wall time from fork to exit and its peak
    resident set in MB (the largest process of its tree: wait4's ru_maxrss)."""
    with open(log, "w") as err:
        t = time.perf_counter()
        proc = subprocess.Popen([str(a) for a in argv], stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        secs = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(map(str, argv[:4]))} failed: {log.read_text()[-2000:]}")
    return secs, usage.ru_maxrss / 1024


def compare_cli(trace: Path, hta_dir: Path, rounds: int, hta_py, tmp: Path) -> dict:
    """HTA's parse against `perfdiag import --timeline` (one process, critical path on) and
    against `perfdiag import` then `perfdiag timeline` (two), each a fresh process,
    interleaved round by round (the order of the three turns each round)."""
    log = tmp / "cli.log"
    h, p, one, imp, tl = [], [], [], [], []
    perfdiag = [sys.executable, "-m", "perfdiag"]
    for r in range(rounds):
        run, run1 = tmp / f"cli-{trace.stem}-{r}", tmp / f"cli1-{trace.stem}-{r}"
        for step in [("hta", "one", "two"), ("one", "two", "hta"), ("two", "hta", "one")][r % 3]:
            if step == "hta":
                h.append(run_process([hta_py, "-c", HTA_CHILD, hta_dir], log))
            elif step == "one":
                one.append(run_process([*perfdiag, "import", trace, "-o", run1, "--timeline"],
                                       log))  # fmt: skip
            else:
                imp.append(run_process([*perfdiag, "import", trace, "-o", run], log))
                tl.append(run_process([*perfdiag, "timeline", run], log))
        p.append(imp[-1][0] + tl[-1][0])
    med = statistics.median
    return {"hta_s": med(x[0] for x in h), "import_s": med(x[0] for x in imp),
            "timeline_s": med(x[0] for x in tl), "total_s": med(p),
            "one_s": med(x[0] for x in one), "one_mb": max(x[1] for x in one),
            "paired": sorted(a[0] / b for a, b in zip(h, p, strict=True)),
            "paired_one": sorted(a[0] / b[0] for a, b in zip(h, one, strict=True)),
            "hta_mb": max(x[1] for x in h), "import_mb": max(x[1] for x in imp),
            "timeline_mb": max(x[1] for x in tl)}  # fmt: skip


def compare(trace: Path, events: int, rounds: int, hta_py, tmp: Path) -> dict:
    hta_dir = tmp / f"hta-{trace.stem}"
    hta_dir.mkdir()
    os.link(trace, hta_dir / trace.name)  # HTA reads a directory of rank files
    h, p = [], []
    for r in range(rounds):  # interleaved: both see the same machine state
        h.append(run_child(hta_py, HTA_CHILD, hta_dir))
        p.append(run_child(sys.executable, PERFDIAG_CHILD, trace, tmp / f"run-{trace.stem}-{r}"))
    # Each round's pair ran back to back: their ratio is steadier than the medians' when
    # the machine's speed drifts over minutes (a shared VM's does, by ±20 %).
    pairs = zip(h, p, strict=True)
    paired = sorted(a["parse_s"] / (b["import_s"] + b["timeline_s"]) for a, b in pairs)
    hs = statistics.median(x["parse_s"] for x in h)
    pi = statistics.median(x["import_s"] for x in p)
    pt = statistics.median(x["import_s"] + x["timeline_s"] for x in p)
    # A child's own peak, or its process tree's summed peak when it had processes.
    # Memory: the timed rounds' own peaks, and one untimed round's process tree.
    h_tree = run_child(hta_py, HTA_CHILD, hta_dir, tree=True)
    p_tree = run_child(sys.executable, PERFDIAG_CHILD, trace, tmp / f"run-{trace.stem}-mem",
                       tree=True)  # fmt: skip
    hm = max(max(x["rss_mb"] for x in h), h_tree["tree_mb"])
    pm = max(max(x["rss_mb"] for x in p), p_tree["tree_mb"])
    hc = max(x["children_rss_mb"] for x in h)
    pc = max(x["children_rss_mb"] for x in p)
    cli = compare_cli(trace, hta_dir, rounds, hta_py, tmp)
    return {"trace": trace.name, "events": events, "hta_s": hs, "import_s": pi, "total_s": pt,
            "critical_path_s": statistics.median(x["critical_path_s"] for x in p), "cli": cli,
            "paired": paired, "workers": sorted({x["workers"] for x in p}),
            "hta_mb": hm, "perfdiag_mb": pm, "hta_children_mb": hc,
            "perfdiag_children_mb": pc}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--repeat",
        type=int,
        nargs="+",
        default=[6, 15],
        help="copies of the real trace's events, one trace per number",
    )
    ap.add_argument(
        "--decoders",
        action="store_true",
        help="also time the candidate JSON decoders on the largest trace's text",
    )
    args = ap.parse_args()
    if not V100.exists():
        raise SystemExit(f"{V100}: the real trace is not here")
    hta_py = hta_python()
    print(f"machine: {machine()}; HTA 0.5.0 in {HTA_VENV}; median of {args.rounds} interleaved "
          "rounds, each in a fresh interpreter (imports excluded)")  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory(prefix="perfdiag-hta-bench-") as tmp:
        tmp = Path(tmp)
        real = tmp / "v100.json.gz"
        real.write_bytes(V100.read_bytes())
        with gzip.open(real, "rt") as f:
            n_real = len(json.load(f)["traceEvents"])
        traces = [(real, n_real)]
        ctx = multiprocessing.get_context("spawn")  # the copies are built outside this
        with ProcessPoolExecutor(1, mp_context=ctx) as pool:  # process: it stays small
            for k in args.repeat:
                big = tmp / f"v100x{k}.json.gz"
                traces.append((big, pool.submit(repeated, real, k, big).result()))
        for trace, n in traces:
            rows.append(compare(trace, n, args.rounds, hta_py, tmp))
        big, n_big = traces[-1]
        decoders = run_child(hta_py, DECODERS_CHILD, big) if args.decoders else {}
    print(f"\n{'trace':<18} {'events':>9} {'HTA parse s':>11} {'perfdiag import s':>17} "
          f"{'+timeline s':>11} {'speed-up':>16} {'HTA MB':>7} {'perfdiag MB':>11}")  # fmt: skip
    for r in rows:
        alone, total = r["hta_s"] / r["import_s"], r["hta_s"] / r["total_s"]
        print(f"{r['trace']:<18} {r['events']:>9,} {r['hta_s']:>11.2f} {r['import_s']:>17.2f} "
              f"{r['total_s']:>11.2f} {alone:>6.2f}x /{total:>5.2f}x "
              f"{r['hta_mb']:>7.0f} {r['perfdiag_mb']:>11.0f}"
              + (f"  (children's own peaks: HTA {r['hta_children_mb']:.0f} MB, perfdiag "
                 f"{r['perfdiag_children_mb']:.0f} MB)"
                 if r["hta_children_mb"] or r["perfdiag_children_mb"] else ""))  # fmt: skip
    print(
        "speed-up: HTA's parse time / perfdiag's import alone, / import + timeline with its "
        "critical path (the target: 5x import + timeline, memory at most half HTA's)"
    )
    print("critical path alone (in process, median): "
          + ", ".join(f"{r['trace']} {r['critical_path_s']:.2f} s" for r in rows))  # fmt: skip
    print("\nas the CLI is used — whole processes, interleaved, imports included: HTA's "
          "`python -c` (import + parse) / `perfdiag import TRACE -o RUN --timeline` (one "
          "process, critical path on); peak RSS of each process (its tree's largest)")  # fmt: skip
    print(f"{'trace':<18} {'events':>9} {'HTA s':>7} {'import --timeline s':>19} "
          f"{'CLI speed-up':>12} {'HTA MB':>7} {'perfdiag MB':>11}")  # fmt: skip
    for r in rows:
        c = r["cli"]
        print(f"{r['trace']:<18} {r['events']:>9,} {c['hta_s']:>7.2f} {c['one_s']:>19.2f} "
              f"{c['hta_s'] / c['one_s']:>11.2f}x {c['hta_mb']:>7.0f} {c['one_mb']:>11.0f}  "
              f"rounds {', '.join(f'{x:.2f}' for x in c['paired_one'])}; "
              f"memory {c['one_mb'] / c['hta_mb']:.2f}x HTA's")  # fmt: skip
    print("\nthe same, as two commands: `perfdiag import` then `perfdiag timeline` (two "
          "processes, two start-ups, the run read back from Parquet)")  # fmt: skip
    print(f"{'trace':<18} {'events':>9} {'HTA s':>7} {'import s':>8} {'timeline s':>10} "
          f"{'CLI speed-up':>12} {'in-process':>10} {'HTA MB':>7} {'import MB':>9} "
          f"{'timeline MB':>11}")  # fmt: skip
    for r in rows:
        c = r["cli"]
        mem = max(c["import_mb"], c["timeline_mb"]) / c["hta_mb"]
        print(f"{r['trace']:<18} {r['events']:>9,} {c['hta_s']:>7.2f} {c['import_s']:>8.2f} "
              f"{c['timeline_s']:>10.2f} {c['hta_s'] / c['total_s']:>11.2f}x "
              f"{r['hta_s'] / r['total_s']:>9.2f}x {c['hta_mb']:>7.0f} {c['import_mb']:>9.0f} "
              f"{c['timeline_mb']:>11.0f}  rounds {', '.join(f'{x:.2f}' for x in c['paired'])}; "
              f"memory {mem:.2f}x HTA's")  # fmt: skip
    print("import + timeline speed-up per round (HTA's parse / perfdiag's, run back to back):")
    for r in rows:
        ratios = r["paired"]
        print(f"  {r['trace']:<18} median {statistics.median(ratios):.2f}x, "
              f"rounds {', '.join(f'{x:.2f}' for x in ratios)}; perfdiag read it with "
              f"{' or '.join(map(str, r['workers']))} process(es)")  # fmt: skip
    if decoders:
        print(f"\nJSON decoders on the {n_big:,}-event text (decompressed once; build/hta-venv):")
    for name, (secs, n) in decoders.items():
        what = f"{secs:6.2f} s  {n_big / secs:>12,.0f} events/s" if secs else f"failed: {n}"
        print(f"  {name:<32} {what}")


if __name__ == "__main__":
    main()
