"""Distributed load (issue 40): the highest constant rate `perfdiag run --target --clients N`
holds with 1 and with 2 client actors, side by side, on a local two-node Ray cluster.

The cluster is tests/ray_cluster.py's (a head and a second node on this machine, one CPU
each; the actors are spread one per node). The server is benchmarks/sse_server.py in its
own process (first token after 1 ms, then one every 1 ms, 8 tokens a request). Per rate,
the 1-actor and 2-actor rounds run back to back, their order alternating, `--seconds` each.
A rate is held when the merged run sent ≥ 0.99 of its target rate and its sends' lateness
against the schedule (sent − scheduled_send, each shard on its own clock) is < 5 ms at p99
(analyzers/load_accuracy.py). Also printed: the worst shard's event-loop lag p99 and the
clock alignment's uncertainty.

On a 2-core machine the two "nodes", their Ray daemons, the driver, the server and the
actors all share the same two cores: the cores bound what this measures, not the design.

    flock /tmp/perfdiag-cpu.lock .venv/bin/python benchmarks/ray_load.py \
        [--seconds 3] [--rates 300,600,900,1200]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from ray_cluster import local_cluster  # noqa: E402

from perfdiag import load_run  # noqa: E402
from perfdiag.analyzers.load_accuracy import schedule_accuracy  # noqa: E402
from perfdiag.probes.http_session import HttpOptions, record_http_run  # noqa: E402
from perfdiag.probes.run_options import ProbeOptions, RunOptions  # noqa: E402
from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec  # noqa: E402
from perfdiag.traces.environment import cpu_model, package_version  # noqa: E402

TOKENS, PROMPT_TOKENS = 8, 16
HELD_RATIO, HELD_P99_S = 0.99, 0.005


def one_round(url: str, address: str, actors: int, rate: float, seconds: float, tmp: Path):
    arrival = ArrivalSpec(mode="open", rate=rate, process="constant")
    spec = WorkloadSpec(requests=int(rate * seconds), warmup=0, arrival=arrival,
                        prompt_len=LengthSpec(value=PROMPT_TOKENS),
                        output_len=LengthSpec(value=TOKENS))  # fmt: skip
    out = tmp / f"a{actors}-r{rate:g}-{len(list(tmp.iterdir()))}"
    options = RunOptions(workload=spec, probes=ProbeOptions(device_sampling=False))
    http = HttpOptions(url=url, scrape_period_s=None, clients=actors, ray_address=address)
    record_http_run(options, out, http=http)
    run = load_run(out)
    ev = run.request_events
    client = ev[(ev["side"] == "client").to_numpy(bool)]
    wide = client.groupby(["request_id", "kind"], observed=True)["ts_ns"].min().unstack("kind")
    acc = schedule_accuracy(wide["sent"].to_numpy("int64"), rate,
                            due_ns=wide["scheduled_send"].to_numpy("int64"))  # fmt: skip
    health = run.manifest.extra["client_health"]
    shards = run.manifest.extra["client_shards"]
    ok = float((run.requests["finish_reason"] == "length").mean())
    return acc, ok, health, shards


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0, help="per round")
    ap.add_argument("--rates", default="300,600,900,1200")
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    server = subprocess.Popen([sys.executable, str(HERE / "sse_server.py"), "--ttft-ms", "1",
                               "--itl-ms", "1"], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{int(server.stdout.readline())}"
        with local_cluster() as cluster, tempfile.TemporaryDirectory() as tmp:
            import ray

            ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
            print(f"machine: {cpu_model()}, {os.cpu_count()} cores, load average "
                  f"{os.getloadavg()[0]:.2f}, Python {platform.python_version()}, "
                  f"ray {package_version('ray')}")  # fmt: skip
            print("cluster: 2 local nodes of 1 CPU each (tests/ray_cluster.py), actors SPREAD; "
                  f"server: benchmarks/sse_server.py, {TOKENS} tokens a request; "
                  f"{args.seconds:g} s per round, constant arrivals, no cap")  # fmt: skip
            print(f"{'actors':>6} {'target/s':>8} | {'achieved':>8} {'ratio':>6} {'p50 ms':>7} "
                  f"{'p99 ms':>7} {'max ms':>7} | {'ok':>5} {'held':>5} {'lag p99':>8} "
                  f"{'clock ±ms':>9} {'behind':>7}")  # fmt: skip
            best = {1: 0.0, 2: 0.0}
            for i, rate in enumerate(rates):
                for actors in (1, 2) if i % 2 == 0 else (2, 1):
                    acc, ok, health, shards = one_round(url, cluster.address, actors, rate,
                                                        args.seconds, Path(tmp))  # fmt: skip
                    held = acc.ratio >= HELD_RATIO and acc.lateness_p99_s < HELD_P99_S
                    if held:
                        best[actors] = max(best[actors], rate)
                    behind = ",".join(map(str, health["shards_behind"])) or "-"
                    print(f"{actors:>6} {rate:>8.0f} | {acc.achieved_rate:>8.1f} "
                          f"{acc.ratio:>6.3f} {acc.lateness_p50_s * 1e3:>7.2f} "
                          f"{acc.lateness_p99_s * 1e3:>7.2f} {acc.lateness_max_s * 1e3:>7.1f} | "
                          f"{ok:>5.0%} {'yes' if held else 'no':>5} "
                          f"{health['loop_lag_p99_ms']:>8.2f} "
                          f"{shards['clock_uncertainty_ns'] / 1e6:>9.3f} {behind:>7}",
                          flush=True)  # fmt: skip
            ray.shutdown()
        print(f"highest rate held (ratio ≥ {HELD_RATIO}, lateness p99 < {HELD_P99_S * 1e3:g} "
              f"ms): 1 actor {best[1]:.0f} req/s, 2 actors {best[2]:.0f} req/s")  # fmt: skip
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
