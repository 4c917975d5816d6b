"""Distributed load (issue 40): `perfdiag run --target URL --clients N [--ray ADDRESS]`.

Without Ray: the split of a workload over shards, the clock alignment, the merge's
timestamp shift and shard tag, the per-shard health verdict, the flags' refusals, and that a
plain run's code path never imports Ray. With Ray (a local two-node cluster,
tests/ray_cluster.py, one per module): two actors placed one per node, their parts merged
into a run whose metrics are those recomputed from the parts' raw events, the CLI end to
end, and an actor killed mid-run (the run names the missing shard, keeps the other, the
gate marks it). Rates held and lateness are the benchmark's (benchmarks/ray_load.py), not
asserted here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from ray_cluster import local_cluster, ray_installed

from perfdiag.errors import ConfigError
from perfdiag.probes.clock_align import ClockAlignment, estimate_offset
from perfdiag.probes.shard_health import merged_health, shard_verdict
from perfdiag.probes.shard_plan import split_plan
from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec, plan
from perfdiag.traces.run_merge import shard_of_args, shifted, with_shard

ROOT = Path(__file__).resolve().parents[1]
needs_ray = pytest.mark.skipif(not ray_installed(), reason="ray is not installed (perfdiag[ray])")
SSE_SERVER = ROOT / "benchmarks" / "sse_server.py"


def _spec(n=12, mode="open", rate=100.0, concurrency=None) -> WorkloadSpec:
    arrival = ArrivalSpec(mode=mode, rate=rate if mode == "open" else None,
                          process="constant", concurrency=concurrency)  # fmt: skip
    return WorkloadSpec(requests=n, warmup=0, arrival=arrival, prompt_len=LengthSpec(value=16),
                        output_len=LengthSpec(value=8))  # fmt: skip


# -- without Ray ---------------------------------------------------------------------------
def test_open_loop_split_keeps_the_one_schedule():
    planned = list(plan(_spec(10), 256))
    shares = split_plan(planned, _spec(10).arrival, 3)
    assert [len(s.planned) for s in shares] == [4, 3, 3]
    merged = sorted((r.offset_s, r.request_id) for s in shares for r in s.planned)
    assert merged == sorted((r.offset_s, r.request_id) for r in planned)  # nothing moved
    assert shares[1].planned[0].request_id == planned[1].request_id


def test_concurrency_is_divided_and_each_shard_needs_one():
    spec = _spec(10, mode="closed", concurrency=5)
    assert [s.concurrency for s in split_plan(list(plan(spec, 256)), spec.arrival, 2)] == [3, 2]
    with pytest.raises(ConfigError, match="cannot be split over 6 clients"):
        split_plan(list(plan(spec, 256)), spec.arrival, 6)
    with pytest.raises(ConfigError, match="3 requests cannot be split over 4"):
        split_plan(list(plan(_spec(3), 256)), _spec(3).arrival, 4)


def test_offset_estimate_brackets_a_known_offset():
    offset = 123_456_789_000

    def remote() -> int:
        time.sleep(0.0002)
        return time.monotonic_ns() + offset

    est = estimate_offset(remote, probes=5)
    assert abs(est.offset_ns - offset) <= est.uncertainty_ns
    assert est.uncertainty_ns == (est.rtt_ns + 1) // 2 and est.rtt_ns >= 200_000


def test_alignment_uncertainty_counts_the_drift():
    start = estimate_offset(lambda: time.monotonic_ns(), probes=3)
    drifted = type(start)(start.offset_ns + 5_000_000, start.uncertainty_ns, start.rtt_ns, 3)
    a = ClockAlignment(start, drifted)
    assert a.drift_ns == 5_000_000 and a.uncertainty_ns == 5_000_000
    assert ClockAlignment(start, None).uncertainty_ns == start.uncertainty_ns


def test_merge_moves_timestamps_and_tags_the_shard():
    events = pa.table({"ts_ns": pa.array([10_000, 20_000], pa.int64())})
    assert shifted(events, "request_events", 1_000)["ts_ns"].to_pylist() == [9_000, 19_000]
    reqs = pa.table({"args": pa.array(['{"max_tokens": 8}', None], pa.string())})
    tagged = with_shard(reqs, 1)["args"].to_pylist()
    assert json.loads(tagged[0]) == {"max_tokens": 8, "client_shard": 1}
    assert [shard_of_args(a) for a in tagged] == [1, 1]
    assert shard_of_args('{"max_tokens": 8}') is None  # a single client's run


def test_the_late_shard_is_named():
    calm = {"loop_lag_p99_ms": 1.0, "reasons": [], "busy": False}
    on_time = shard_verdict(0, calm, {"send_lateness_p99_ms": 1.2, "sends": 10})
    behind = shard_verdict(1, calm, {"send_lateness_p99_ms": 40.0, "sends": 10})
    assert not on_time["client_bound"] and behind["client_bound"]
    merged = merged_health({0: on_time, 1: behind}, missing=[])
    assert merged["shards_behind"] == [1] and merged["client_bound"]
    assert merged["reasons"] == ["shard 1: sends p99 40.0 ms behind schedule"]
    assert merged["send_lateness_p99_ms"] == 40.0


def test_clients_without_target_is_one_line(cli):
    for args in (["--clients", "2"], ["--ray", "auto"], ["--ray-address", "auto"]):
        done = cli("run", *args, "-n", "2")
        assert done.returncode == 1 and "need --target" in done.stderr
        assert "Traceback" not in done.stderr
    done = cli("run", "--target", "http://127.0.0.1:9", "--ray-address", "", "-n", "2")
    assert done.returncode == 1 and "--ray-address is empty" in done.stderr + done.stdout
    done = cli("run", "--target", "http://127.0.0.1:9", "--clients", "0", "-n", "2")
    assert done.returncode == 1 and "--clients must be >= 1" in done.stderr + done.stdout


@needs_ray
def test_an_unreachable_cluster_is_one_line_at_once(cli, tmp_path):
    # Ray itself retries a dead address for minutes, its C++ warnings all the while.
    started = time.monotonic()
    done = cli("run", "--target", "http://127.0.0.1:9", "--ray", "127.0.0.1:1", "-n", "2",
               "--quiet", "-o", str(tmp_path / "run"))  # fmt: skip
    assert done.returncode == 1 and time.monotonic() - started < 30
    assert "cannot reach the Ray cluster at 127.0.0.1:1" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def server():
    """benchmarks/sse_server.py in its own process: 8 one-token chunks, 1 ms apart."""
    proc = subprocess.Popen([sys.executable, str(SSE_SERVER), "--ttft-ms", "1", "--itl-ms",
                             "1"], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        yield f"http://127.0.0.1:{int(proc.stdout.readline())}"
    finally:
        proc.kill()
        proc.wait()


def test_a_plain_target_run_never_imports_ray(server, tmp_path):
    code = f"""
import sys
from perfdiag.cli import app
try:
    app(["run", "--target", "{server}", "-n", "4", "--rate", "50", "--output-len", "4",
         "--prompt-len", "8", "--quiet", "--metrics-period", "0", "-o", "{tmp_path / "run"}"])
except SystemExit as e:
    assert not e.code, e.code
print("ray" in sys.modules, any(m.startswith("ray.") for m in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "False False"


# -- with Ray: a local two-node cluster -----------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    if not ray_installed():
        pytest.skip("ray is not installed (perfdiag[ray])")
    with local_cluster() as c:
        yield c


@pytest.fixture
def connected(cluster):
    import ray

    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()


def _record(url, out, n, rate, cluster, on_actors=None):
    from perfdiag.probes.http_session import HttpOptions
    from perfdiag.probes.ray_load import record_sharded_run
    from perfdiag.probes.run_options import ProbeOptions, RunOptions

    options = RunOptions(workload=_spec(n, rate=rate), probes=ProbeOptions(device_sampling=False))
    http = HttpOptions(url=url, scrape_period_s=0.5, clients=2, ray_address=cluster.address)
    return record_sharded_run(options, out, http=http, on_actors=on_actors)


def _raw_metrics(run_dir: Path) -> dict:
    """TTFT, E2E and throughput recomputed from the parts' raw client events, each part's
    timestamps moved by its recorded clock offset: no analyzer involved."""
    from perfdiag import load_run

    shards = load_run(run_dir).manifest.extra["client_shards"]
    rows = []
    tokens = 0
    for s in shards["shards"]:
        part = load_run(run_dir / s["part"])
        ev = part.request_events
        ev = ev[(ev["side"] == "client").to_numpy(bool)]
        first = ev.groupby(["request_id", "kind"], observed=True)["ts_ns"].min().unstack()
        first = first - s["clock"]["offset_ns"]
        rows.append(first[["sent", "first_token", "done"]])
        tokens += int(part.requests["output_tokens"].sum())
    import pandas as pd

    t = pd.concat(rows)
    ttft = (t["first_token"] - t["sent"]).to_numpy(np.float64) / 1e9
    e2e = (t["done"] - t["sent"]).to_numpy(np.float64) / 1e9
    span = (t["done"].max() - t["sent"].min()) / 1e9
    return {"requests": len(t), "ttft_p50": np.percentile(ttft, 50),
            "ttft_p99": np.percentile(ttft, 99), "e2e_p50": np.percentile(e2e, 50),
            "e2e_p99": np.percentile(e2e, 99), "tokens_per_s": tokens / span}  # fmt: skip


def _merged_metrics(run_dir: Path) -> dict:
    from perfdiag import load_run
    from perfdiag.analyzers.lifecycle import build_lifecycle
    from perfdiag.analyzers.metrics import serving_metrics
    from perfdiag.analyzers.steady_state import find_window

    lc = build_lifecycle(load_run(run_dir))
    m = serving_metrics(lc, find_window(lc.requests, lc.origin_ns, steady=False))
    return {"requests": m.outcomes.requests, "ttft_p50": m.ttft_s.p50, "ttft_p99": m.ttft_s.p99,
            "e2e_p50": m.e2e_s.p50, "e2e_p99": m.e2e_s.p99,
            "tokens_per_s": m.throughput.output_tokens_per_s}  # fmt: skip


@needs_ray
def test_two_actors_on_two_nodes_merge_into_one_run(connected, server, tmp_path):
    from perfdiag import load_run

    out = tmp_path / "run"
    result = _record(server, out, n=300, rate=300.0, cluster=connected)
    assert result.status == "complete"
    run = load_run(out)
    shards = run.manifest.extra["client_shards"]
    assert len({s["node_id"] for s in shards["shards"]}) == 2  # SPREAD: one per node
    assert shards["missing"] == {} and shards["placement"] == "SPREAD"
    for s in shards["shards"]:
        assert s["clock"]["end"] is not None and s["clock"]["uncertainty_ns"] > 0
        assert (out / s["part"] / "manifest.json").exists()  # every part kept
    assert shards["clock_uncertainty_ns"] == max(s["clock"]["uncertainty_ns"]
                                                 for s in shards["shards"])  # fmt: skip
    # The tables of a single client's run, plus the shard in each request's args.
    assert len(run.requests) == 300
    tags = [shard_of_args(a) for a in run.requests["args"]]
    assert sorted(set(tags)) == [0, 1] and tags.count(0) == 150
    scopes = set(run.counters["scope"].astype(str))
    assert {"client/shard0", "client/shard1"} <= scopes
    health = run.manifest.extra["client_health"]
    assert set(health["shards"]) == {"0", "1"}
    assert all(h["sends"] == 150 for h in health["shards"].values())
    from perfdiag.playbooks.facts import TriageContext, Unavailable, evaluate_fact

    stalls = evaluate_fact("client_stalls", TriageContext(run), {})
    assert isinstance(stalls, Unavailable) and "client shards" in stalls.reason
    clock = evaluate_fact("clock_uncertainty_ms", TriageContext(run), {})
    assert clock.value >= shards["clock_uncertainty_ns"] / 1e6  # the gate counts the shards
    merged, raw = _merged_metrics(out), _raw_metrics(out)
    assert merged["requests"] == raw["requests"] == 300
    for key in ("ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99", "tokens_per_s"):
        assert merged[key] == pytest.approx(raw[key], rel=0.01), key


@needs_ray
def test_a_killed_actor_is_a_missing_shard(connected, server, tmp_path):
    import ray

    from perfdiag import load_run
    from perfdiag.playbooks.evaluate import run_triage
    from perfdiag.playbooks.facts import TriageContext

    def kill_later(actors):
        threading.Timer(1.0, lambda: ray.kill(actors[1])).start()

    out = tmp_path / "run"
    result = _record(server, out, n=300, rate=100.0, cluster=connected, on_actors=kill_later)
    run = load_run(out)
    shards = run.manifest.extra["client_shards"]
    assert list(shards["missing"]) == ["1"] and "ActorDiedError" in shards["missing"]["1"]
    assert run.manifest.extra["parts_missing"][0]["part"] == "client shard 1"
    assert result.status == "complete"  # shard 0 ran to its end
    tags = {shard_of_args(a) for a in run.requests["args"]}
    assert tags == {0} and len(run.requests) == 150  # the rest kept, whole
    assert not (out / "parts" / "shard1").exists()
    assert run_triage(TriageContext(run)).by_check("parts-missing") is not None


@needs_ray
def test_cli_end_to_end(cluster, server, tmp_path):
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "perfdiag", "run", "--target", server, "--clients", "2",
         "--ray", cluster.address, "-n", "40", "--rate", "80", "--prompt-len", "16",
         "--output-len", "8", "--quiet", "-o", str(out)],
        capture_output=True, text=True, timeout=180, env=cluster.subprocess_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "requests/s" in done.stdout
    from perfdiag import load_run

    run = load_run(out)
    assert run.manifest.extra["client_shards"]["count"] == 2 and run.status == "complete"
    assert {shard_of_args(a) for a in run.requests["args"]} == {0, 1}


@needs_ray
def test_sigterm_keeps_what_every_shard_recorded(cluster, server, tmp_path):
    """ray.init makes SIGTERM exit at once; perfdiag's handler must stay, stopping the
    shards and merging what they recorded."""
    import signal

    from perfdiag import load_run

    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "perfdiag", "run", "--target", server, "--clients", "2",
         "--ray", cluster.address, "-n", "2000", "--rate", "100", "--prompt-len", "16",
         "--output-len", "8", "--quiet", "-o", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cluster.subprocess_env(),
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (out / "manifest.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(2.0)  # the shards are sending
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stdout[-2000:] + stderr[-2000:]
    assert "everything recorded is kept" in stdout
    run = load_run(out)
    assert run.status == "interrupted"
    tags = [shard_of_args(a) for a in run.requests["args"]]
    assert set(tags) == {0, 1} and 20 < len(tags) < 2000


@needs_ray
def test_a_sweep_point_splits_its_load_too(cluster, server, tmp_path):
    """sweep and capacity speak the run flags: --set clients=2 --set ray=ADDRESS."""
    from perfdiag import load_run

    done = subprocess.run(
        [sys.executable, "-m", "perfdiag", "sweep", "--target", server, "--set", "clients=2",
         "--set", f"ray={cluster.address}", "--set", "requests=20", "--set", "warmup=0",
         "--set", "prompt-len=16", "--set", "output-len=8", "--vary", "rate=40,80",
         "--quiet", "-o", str(tmp_path / "sweep")],
        capture_output=True, text=True, timeout=300, env=cluster.subprocess_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    runs = [m.parent for m in (tmp_path / "sweep").rglob("manifest.json")
            if "parts" not in m.parent.parts]  # fmt: skip
    assert len(runs) == 2
    for path in runs:
        run = load_run(path)
        assert run.manifest.extra["client_shards"]["count"] == 2
        assert {shard_of_args(a) for a in run.requests["args"]} == {0, 1}
