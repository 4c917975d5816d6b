"""Load-generator accuracy: does `perfdiag run --target` offer the rate it is asked for, on
time — and how does it compare with aiperf on the same server, in the same run?

The server is benchmarks/sse_server.py in its own process (first token after 1 ms, then a
token every 1 ms, 8 tokens a request: a real stream the client must parse, costing the
server almost nothing). Open loop, constant arrivals, no concurrency cap, at each target
rate; per rate the two tools run back to back, their order alternating (interleaved), the
server idle between. Reported per tool and rate, from two views of the same arrivals
(analyzers/load_accuracy.py):

  client   the tool's own record. perfdiag: each send against its due time (the schedule
           is recorded). aiperf: its request_start_ns against the ideal schedule rebuilt
           from the rate (aiperf records no due times).
  server   the server's receipt of each request (headers read), schedule rebuilt the
           same way for both tools — the view that does not trust the client.

achieved/target = (n − 1) / span; lateness p50/p99 from the schedule; "behind" when the
run offered < 0.99 of its target or its lateness grew over the run (a slip, not jitter).
perfdiag's run also reports its event-loop lag p99 and whether it flagged itself
client-bound; "steal" is the share of the machine's CPU time the hypervisor gave to other
guests during the round (psutil's steal: on a shared VM it pauses every thread for tens of
ms at a time, and no client can be on time through that).
aiperf comes from `make third-party` (.venv-third-party) or $PERFDIAG_AIPERF;
without it the aiperf rows are skipped, saying so.

    .venv/bin/python benchmarks/http_client.py [--seconds 5] [--rates 20,100,300,600]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import psutil

# A sibling module: run as a script, this file's directory is first on sys.path.
from aiperf_anchor import AiperfLoad, aiperf_bin, aiperf_version, run_aiperf

from perfdiag import load_run
from perfdiag.analyzers.load_accuracy import ScheduleAccuracy, schedule_accuracy
from perfdiag.engine_ref.gguf_loader import preset_file
from perfdiag.engine_ref.gguf_tokenizer import GGUFTokenizer
from perfdiag.probes.http_session import HttpOptions, record_http_run, steal_pct
from perfdiag.probes.run_options import ProbeOptions, RunOptions
from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec
from perfdiag.traces.environment import cpu_model, package_version

TOKENS, PROMPT_TOKENS = 8, 16
HERE = Path(__file__).resolve().parent


def machine() -> str:
    load = os.getloadavg()[0]
    return (f"{cpu_model()}, {os.cpu_count()} cores, load average {load:.2f}, Python "
            f"{platform.python_version()}, aiohttp {package_version('aiohttp')}")  # fmt: skip


def take_arrivals(url: str) -> list[int]:
    """The server's receipt times since the last call, the perfdiag probe left out."""
    with urllib.request.urlopen(f"{url}/arrivals") as resp:
        pairs = json.loads(resp.read())
    return [ts for ts, rid in pairs if rid != "perfdiag-probe"]


def perfdiag_round(url: str, rate: float, n: int, tmp: Path) -> dict:
    arrival = ArrivalSpec(mode="open", rate=rate, process="constant")
    spec = WorkloadSpec(requests=n, warmup=0, arrival=arrival,
                        prompt_len=LengthSpec(value=PROMPT_TOKENS),
                        output_len=LengthSpec(value=TOKENS))  # fmt: skip
    out = tmp / f"perfdiag-{rate:g}-{len(list(tmp.glob('perfdiag-*')))}"
    options = RunOptions(workload=spec, probes=ProbeOptions(device_sampling=False))
    record_http_run(options, out, http=HttpOptions(url=url, scrape_period_s=None))
    run = load_run(out)
    ev = run.request_events
    first = ev[ev["side"] == "client"].groupby(["request_id", "kind"], observed=True)["ts_ns"].min()
    wide = first.unstack("kind")
    own = schedule_accuracy(wide["sent"].to_numpy("int64"), rate,
                            due_ns=wide["scheduled_send"].to_numpy("int64"))  # fmt: skip
    health = run.manifest.extra["client_health"]
    ok = float((run.requests["finish_reason"] == "length").mean())
    return {"own": own, "ok": ok, "lag_p99_ms": health["loop_lag_p99_ms"],
            "bound": health["client_bound"]}  # fmt: skip


def aiperf_round(exe: Path, url: str, rate: float, n: int, tmp: Path, tokenizer: Path) -> dict:
    out = tmp / f"aiperf-{rate:g}-{len(list(tmp.glob('aiperf-*')))}"
    res = run_aiperf(exe, url, "null", AiperfLoad(requests=n, rate=rate), out,
                     tokenizer=tokenizer, prompt_tokens=PROMPT_TOKENS,
                     output_tokens=TOKENS)  # fmt: skip
    rec = res.records
    own = schedule_accuracy(rec["start_ns"].to_numpy("int64"), rate)
    return {"own": own, "ok": float(rec["ok"].mean()), "lag_p99_ms": None, "bound": None}


def row(tool: str, rate: float, r: dict, server: ScheduleAccuracy | None) -> str:
    own: ScheduleAccuracy = r["own"]
    behind = own.fell_behind or (server is not None and server.fell_behind)
    s = (
        f"{tool:9} {rate:8.0f} | {own.achieved_rate:9.1f} {own.ratio:6.3f} "
        f"{own.lateness_p50_s * 1e3:7.2f} {own.lateness_p99_s * 1e3:7.2f} "
        f"{own.lateness_max_s * 1e3:7.1f} {own.basis:>8} | "
    )
    if server is None:
        s += f"{'-':>9} {'-':>6} {'-':>7} {'-':>7} | "
    else:
        s += (
            f"{server.achieved_rate:9.1f} {server.ratio:6.3f} {server.lateness_p50_s * 1e3:7.2f} "
            f"{server.lateness_p99_s * 1e3:7.2f} | "
        )
    steal = "-" if r["steal"] is None else f"{r['steal']:.0f}%"
    s += f"{r['ok']:5.0%} {'yes' if behind else 'no':>6} {steal:>6} "
    if r["lag_p99_ms"] is not None:
        s += f"{r['lag_p99_ms']:8.2f} {'yes' if r['bound'] else 'no':>6}"
    return s  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=5.0, help="per tool and rate")
    ap.add_argument("--rates", default="20,100,300,600")
    ap.add_argument("--no-aiperf", action="store_true", help="perfdiag's client only")
    args = ap.parse_args()
    exe = None if args.no_aiperf else aiperf_bin()
    proc = subprocess.Popen([sys.executable, str(HERE / "sse_server.py"), "--ttft-ms", "1",
                             "--itl-ms", "1"], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{int(proc.stdout.readline())}"
        print(f"machine: {machine()}")
        print(f"aiperf: {aiperf_version(exe) if exe else 'not installed (make third-party)'}")
        print(f"server: benchmarks/sse_server.py, its own process; TTFT 1 ms, ITL 1 ms, {TOKENS} "
              f"tokens a request; open loop, constant arrivals, no cap, {args.seconds:g} s "
              "per tool and rate, tools interleaved")  # fmt: skip
        print(f"{'':19}| {'client (own record)':^50} | {'server (receipt)':^33} |")
        print(f"{'tool':9} {'target/s':>8} | {'achieved':>9} {'ratio':>6} {'p50 ms':>7} "
              f"{'p99 ms':>7} {'max ms':>7} {'basis':>8} | {'achieved':>9} {'ratio':>6} "
              f"{'p50 ms':>7} "
              f"{'p99 ms':>7} | {'ok':>5} {'behind':>6} {'steal':>6} {'lag p99':>8} "
              f"{'bound':>6}")  # fmt: skip
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            tokenizer = GGUFTokenizer(preset_file("smollm2-135m")).save_hf(tmp / "tokenizer")
            take_arrivals(url)
            for i, rate in enumerate(float(r) for r in args.rates.split(",")):
                n = max(20, int(rate * args.seconds))
                tools = ["perfdiag", "aiperf"] if exe else ["perfdiag"]
                for tool in tools if i % 2 == 0 else tools[::-1]:
                    before = psutil.cpu_times()
                    if tool == "perfdiag":
                        r = perfdiag_round(url, rate, n, tmp)
                    else:
                        r = aiperf_round(exe, url, rate, n, tmp, tokenizer)
                    r["steal"] = steal_pct(before, psutil.cpu_times())
                    seen = take_arrivals(url)
                    server = schedule_accuracy(seen, rate) if len(seen) >= 2 else None
                    print(row(tool, rate, r, server), flush=True)
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
