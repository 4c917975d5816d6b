"""Many-rank import through Ray (issue 40): the run equals the serial import's, the
cross-rank analysis on the tasks' summaries equals that of the merged run, a dead task
leaves its rank out and says so; and without --ray nothing imports Ray."""

import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from ray_cluster import RAY, local_cluster

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from make_rank_traces import make_rank_traces  # noqa: E402

from perfdiag.analyzers.rank_summary import cross_rank, summarize  # noqa: E402
from perfdiag.analyzers.spans import timeline_spans  # noqa: E402
from perfdiag.traces.importers.kineto import import_kineto  # noqa: E402
from perfdiag.traces.reader import load_run  # noqa: E402

KINETO = ROOT / "tests/data/kineto"
TABLES = ("spans", "counters", "requests", "request_events", "steps")
# Not `import ray` here: a process that imported ray before the cluster's token was set
# cannot join it; the Ray imports run in CLI subprocesses given the cluster's env.
HAVE_RAY = importlib.util.find_spec("ray") is not None and RAY.exists()
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="ray is not installed")


def _events(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def test_generated_ranks_are_the_source_shifted(tmp_path):
    files = make_rank_traces(tmp_path, 3, skew_us=7)
    src = [_events(KINETO / f"sampled_rank-{i}.json.gz") for i in (0, 1)]
    for r, f in enumerate(files):
        doc, orig = _events(f), src[r % 2]
        assert doc["distributedInfo"] == {**orig["distributedInfo"], "rank": r, "world_size": 3}
        assert len(doc["traceEvents"]) == len(orig["traceEvents"])
        for a, b in zip(doc["traceEvents"], orig["traceEvents"], strict=True):
            assert a["ts"] - b["ts"] == 7 * r  # integer µs: exact
            assert {k: v for k, v in a.items() if k != "ts"} == {
                k: v for k, v in b.items() if k != "ts"
            }
    based = make_rank_traces(tmp_path / "b", 2, skew_us=5, sources=[KINETO / "mi250_rocm.json.gz"])
    d0, d1 = _events(based[0]), _events(based[1])
    assert d1["baseTimeNanoseconds"] - d0["baseTimeNanoseconds"] == 5000
    assert d1["traceEvents"] == d0["traceEvents"]  # ts relative to the base: unchanged


def test_a_directory_means_its_trace_files(tmp_path):
    files = make_rank_traces(tmp_path / "ranks", 2)
    (tmp_path / "ranks" / "notes.txt").write_text("not a trace")
    cli = [sys.executable, "-m", "perfdiag", "import"]
    subprocess.run([*cli, str(tmp_path / "ranks"), "--out", str(tmp_path / "d")], check=True,
                   capture_output=True)  # fmt: skip
    subprocess.run([*cli, *map(str, files), "--out", str(tmp_path / "f")], check=True,
                   capture_output=True)  # fmt: skip
    assert load_run(tmp_path / "d").arrow("spans").equals(load_run(tmp_path / "f").arrow("spans"))
    empty = tmp_path / "empty"
    empty.mkdir()
    done = subprocess.run([*cli, str(empty), "--out", str(tmp_path / "e")], capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 1 and "no *.json or *.json.gz trace files" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_plain_import_does_not_import_ray(tmp_path):
    code = (
        "import sys\nfrom perfdiag.cli import app\n"
        f"try:\n    app([{str(KINETO / 'cpu_only.json.gz')!r}, '--out', {str(tmp_path / 'r')!r}])\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "print('ray' in sys.modules)\n"
    )
    code = code.replace("app([", "app(['import', ")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False"


@pytest.fixture(scope="module")
def cluster():
    if not HAVE_RAY:
        pytest.skip("ray is not installed")
    with local_cluster() as c:
        yield c


def _ray_import(cluster, args: list, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "perfdiag", "import", *map(str, args), "--ray", "--ray-address",
         cluster.address, "--json"],
        capture_output=True, text=True, env={**cluster.subprocess_env(), **(env or {})},
        timeout=300,
    )  # fmt: skip


def _assert_same_run(a: Path, b: Path) -> None:
    ra, rb = load_run(a), load_run(b)
    for name in TABLES:
        ta, tb = ra.arrow(name), rb.arrow(name)
        assert ta.num_rows == tb.num_rows, name
        assert ta.equals(tb), name  # same rows in the same order
    assert ra.manifest.clock == rb.manifest.clock
    assert ra.manifest.environment == rb.manifest.environment
    fa, fb = ra.manifest.extra["kineto"]["files"], rb.manifest.extra["kineto"]["files"]
    keys = ("path", "rank", "rank_source", "base_time_ns", "events", "spans", "profiler_windows")
    assert [{k: f[k] for k in keys} for f in fa] == [{k: f[k] for k in keys} for f in fb]


@needs_ray
@pytest.mark.parametrize(
    "source, ranks",
    [(None, 4), (KINETO / "mi250_rocm.json.gz", 3)],  # Unix-µs ts; a time base per file
    ids=["unix-us", "time-base"],
)
def test_ray_import_equals_the_serial_import(cluster, tmp_path, source, ranks):
    files = make_rank_traces(tmp_path / "ranks", ranks, sources=[source] if source else None)
    done = _ray_import(cluster, [*files, "--out", tmp_path / "ray", "--parts-dir",
                                 tmp_path / "parts"])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    s = json.loads(done.stdout)
    import_kineto(files, tmp_path / "serial")
    _assert_same_run(tmp_path / "ray", tmp_path / "serial")
    assert not s["missing"] and len(s["files"]) == ranks
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == [
        f"rank-{r}" for r in range(ranks)
    ]
    # The driver's cross-rank analysis on the tasks' summaries = the merged run's.
    serial = load_run(tmp_path / "serial")
    whole = json.loads(json.dumps(cross_rank(summarize(timeline_spans(serial))).to_dict()))
    assert s["cross_rank"] == whole
    saved = json.loads((tmp_path / "ray" / "results" / "cross_rank.json").read_text())
    assert {k: saved[k] for k in whole} == whole
    assert len(whole["per_rank"]) == ranks


@needs_ray
def test_a_dead_task_leaves_its_rank_out_and_the_gate_says_so(cluster, tmp_path):
    files = make_rank_traces(tmp_path / "ranks", 4)
    # rank 3: a malformed event past the file's head (its task fails reading it)
    text = gzip.decompress(files[3].read_bytes()).decode()
    cut = text.index('{"ph"', len(text) * 3 // 4)
    files[3].write_bytes(gzip.compress((text[:cut] + "@@" + text[cut:]).encode()))
    # rank 2: its worker dies (os._exit in the task, as an OOM kill would end it)
    done = _ray_import(cluster, [tmp_path / "ranks", "--out", tmp_path / "run"],
                       env={"PERFDIAG_RAY_IMPORT_KILL": files[2].name})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    missing = {m["rank"]: m["reason"] for m in summary["missing"]}
    assert set(missing) == {2, 3}
    assert "worker died" in missing[2]
    assert "malformed JSON" in missing[3]  # the importer's own message
    assert "rank 2 (rank-002.json.gz) is missing" in done.stderr
    run = load_run(tmp_path / "run")
    assert sorted(run.spans["rank"].dropna().unique().tolist()) == [0, 1]
    assert [m["rank"] for m in run.manifest.extra["parts_missing"]] == [2, 3]
    assert [r["rank"] for r in summary["cross_rank"]["per_rank"]] == [0, 1]
    assert summary["ray"]["tasks"] == 4 and summary["ray"]["nodes"] >= 1
    from perfdiag.playbooks.evaluate import run_triage
    from perfdiag.playbooks.facts import TriageContext

    checks = {f.check: f for f in run_triage(TriageContext(run)).findings if f.step == 0}
    assert "parts-missing" in checks
    assert "rank 2, rank 3" in checks["parts-missing"].title


def test_cross_rank_names_the_straggler_and_the_rank_waited_for():
    import pandas as pd

    from perfdiag.analyzers.rank_summary import RankSummary

    # Step 7: rank 1's window is longest (12 vs the median 11); the one collective: rank 2
    # enters last (at 130), so rank 0 waits 30 and rank 1 waits 10.
    b = pd.DataFrame({"rank_key": [0, 1, 2], "step": [7, 7, 7], "name": "ProfilerStep#7",
                      "start_ns": 0, "end_ns": [10, 12, 11], "wall_ns": [10, 12, 11],
                      "idle_ns": [5, 2, 1]})  # fmt: skip
    r = pd.DataFrame({"rank_key": [0, 1, 2], "kind": "gpu", "resource": "gpu 0",
                      "busy_ns": [4, 9, 9], "idle_ns": [6, 3, 2]})  # fmt: skip
    c = pd.DataFrame({"rank": [0, 1, 2], "where": "gpu", "name": "ncclKernel_AllReduce",
                      "seq": 0, "start_ns": [100, 120, 130], "dur_ns": [50, 30, 20]})  # fmt: skip
    x = cross_rank(RankSummary(b, r, c))
    assert x.straggler_rank == 1 and x.waited_for_rank == 2
    assert x.stragglers.to_dict("records") == [
        {"step": 7, "ranks": 3, "slowest_rank": 1, "wall_ns": 12, "median_ns": 11, "excess_ns": 1}
    ]
    assert x.per_rank["wait_ns"].tolist() == [30, 10, 0]
    assert x.per_rank["busy_ns"].tolist() == [5, 10, 10]
    assert x.per_rank["gpu_idle_ns"].tolist() == [6, 3, 2]
    assert x.imbalance == 0.5
    assert x.collectives[["slowest_rank", "lateness_ns", "wall_ns"]].values.tolist() == [
        [2, 30, 50]
    ]


@needs_ray
def test_bad_ray_options_are_one_line_errors(tmp_path):
    trace = KINETO / "cpu_only.json.gz"
    cli = [sys.executable, "-m", "perfdiag", "import", str(trace), "--out", str(tmp_path / "r")]
    for extra, says in (
        (
            ["--ray", "--ray-address", "127.0.0.1:1"],
            "nothing answers there",
        ),  # no minutes of retries
        (["--ray-address", "127.0.0.1:1"], "nothing answers there"),  # implies --ray
        (["--ray-address", " "], "--ray-address is empty"),  # not a local cluster
        (["--parts-dir", str(tmp_path / "p")], "goes with --ray"),
        (["--ray", "--jobs", "2"], "--jobs does not apply with --ray"),
    ):
        done = subprocess.run([*cli, *extra], capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and says in done.stderr, (extra, done.stderr[-500:])
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()
