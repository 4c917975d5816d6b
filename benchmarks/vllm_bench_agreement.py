"""perfdiag's client against vLLM's own benchmark client (`vllm bench serve`), on one vLLM
server under the same load (issue 34).

One vLLM (0.32.0, the CPU build, SmolLM2-135M-Instruct, bfloat16, `--enforce-eager`) is
launched once and warmed up by two requests; then, for each round, each load is driven by
`vllm bench serve` and straight after by `perfdiag run --target` (A, B, A, B, …), so a
drift of the machine reaches both alike. Loads (fixed lengths, `ignore_eos`, temperature 0,
streaming /v1/completions, no warm-up requests in either tool):

  open     open loop at `--rate` req/s, Poisson arrivals in both tools (vLLM
           `--request-rate R --burstiness 1`, perfdiag `--rate R --arrival poisson`);
           each tool seeded with the round's number
  closed   closed loop of `--concurrency` clients (vLLM `--max-concurrency C` at an
           infinite request rate: every request queued at once, C at a time; perfdiag
           `-c C --closed`)
  constant open loop at `--rate` with evenly spaced arrivals (vLLM `--burstiness
           1000000`, a gamma that close to constant; perfdiag `--arrival constant`):
           the same schedule in both, so a gap the open loop shows that vanishes here
           is the two tools' Poisson draws (not in the default `--loads`)

Definitions are matched (docs/metrics.md, "Other tools' names for these"): TTFT, TPOT =
(E2E − TTFT)/(N − 1), ITL per chunk and E2E are per request in both; throughput is vLLM's
over its whole benchmark, so perfdiag's is read from `perfdiag analyze RUN --full-run`
(first send → last completion) rather than its default steady-state window, which is shown
beside for reference. Each figure is the median over rounds of the tool's own per-round
p50 (or throughput); the range over rounds is in brackets. The lines under each table are
facts that explain gaps: the windows each tool divides by, vLLM's tokens over perfdiag's
kind of window (its own per-request records, `--save-detailed`), the offered rates (vLLM
rescales its Poisson draw so the last send lands at N/R; perfdiag keeps the draw), the
prompt lengths the server counted, and the server's own record of each client's run:
vLLM's inter-token-latency histogram (sum/count, scraped by this script just before and
after each client runs) and its API server's CPU time. A client whose mean ITL equals the
server's measures the server as it was; a gap between the two tools that the server's
histogram shows too is the server running slower, not a client measuring differently.
`--extras-variant` adds, after each pair, vLLM bench asking what perfdiag asks of the
server (`return_token_ids`, usage in every chunk): whether that extra work is a gap's cause.

One vLLM measurement at a time on this machine: the script holds an exclusive lock on
/tmp/perfdiag-vllm.lock while its server runs and waits until no other `vllm serve` runs.

    make vllm && .venv/bin/python benchmarks/vllm_bench_agreement.py [--rounds 3] [--extras-variant]
    .venv/bin/python benchmarks/vllm_bench_agreement.py --summarise build/vllm-bench-agreement/STAMP
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = Path("/tmp/perfdiag-vllm.lock")  # one vLLM measurement at a time on this machine
POLL_S = 20.0  # between two looks for another `vllm serve`
SERVED_NAME = "smollm2"
WITHIN = 0.05  # the agreement asked for


@dataclass(frozen=True)
class Load:
    name: str
    requests: int
    prompt_len: int
    output_len: int
    rate: float | None = None  # open loop: requests/s
    concurrency: int | None = None  # closed loop: clients
    constant: bool = False  # open loop: evenly spaced arrivals instead of Poisson

    def vllm_args(self) -> list[str]:
        if self.rate is not None:  # a gamma of shape 1e6: gaps within 0.1 % of 1/R
            return ["--request-rate", f"{self.rate:g}", "--burstiness",
                    "1000000" if self.constant else "1"]  # fmt: skip
        return ["--max-concurrency", str(self.concurrency)]

    def perfdiag_args(self) -> list[str]:
        if self.rate is not None:
            return ["--rate", f"{self.rate:g}", "--arrival",
                    "constant" if self.constant else "poisson"]  # fmt: skip
        return ["-c", str(self.concurrency), "--closed"]


# (label, unit, vLLM result key, perfdiag metrics path, scale to the unit)
METRICS = (
    ("TTFT p50", "ms", "median_ttft_ms", ("ttft_s", "p50"), 1e3),
    ("TTFT p90", "ms", "p90_ttft_ms", ("ttft_s", "p90"), 1e3),
    ("TPOT p50", "ms", "median_tpot_ms", ("tpot_s", "p50"), 1e3),
    ("ITL p50 (per chunk)", "ms", "median_itl_ms", ("itl_per_chunk_s", "p50"), 1e3),
    ("E2E p50", "ms", "median_e2el_ms", ("e2e_s", "p50"), 1e3),
    ("output throughput", "tok/s", "output_throughput",
     ("throughput", "output_tokens_per_s"), 1.0),
    ("request throughput", "req/s", "request_throughput", ("throughput", "requests_per_s"), 1.0),
)  # fmt: skip


# ---- the two result formats --------------------------------------------------------------
def read_vllm(path: Path) -> dict:
    """A `vllm bench serve --save-result --save-detailed` JSON: the compared figures under
    their labels, and facts from its per-request records."""
    res = json.loads(Path(path).read_text())
    out = {label: float(res[key]) for label, _, key, _, _ in METRICS}
    done = [(s, s + lat) for s, lat, err in zip(res.get("start_times") or [],
                                                res.get("latencies") or [],
                                                res.get("errors") or [], strict=True)
            if not err]  # fmt: skip
    starts, ends = [s for s, _ in done], [e for _, e in done]
    out["facts"] = {
        "completed": int(res["completed"]),
        "failed": int(res.get("failed", 0)),
        "duration_s": float(res["duration"]),
        "output_tokens": int(res["total_output_tokens"]),
        "output_tok_s": float(res["output_throughput"]),
        "itl_mean_ms": float(res["mean_itl_ms"]),
        "prompt_tokens_mean": float(res["total_input_tokens"]) / max(1, int(res["completed"])),
    }
    if len(starts) > 1:
        span = max(ends) - min(starts)  # first send → last token: perfdiag's whole run
        out["facts"]["first_send_to_last_s"] = span
        out["facts"]["output_tok_s_over_sends"] = res["total_output_tokens"] / span
        out["facts"]["sent_rate_rps"] = (len(starts) - 1) / (max(starts) - min(starts) or 1e-9)
        out["facts"]["first_send_s"] = min(starts) - (max(ends) - float(res["duration"]))
    return out


def _at(obj: dict, path: tuple[str, ...]) -> float:
    for key in path:
        obj = obj[key]
    return float(obj) if obj is not None else float("nan")


def read_perfdiag(full: Path, steady: Path) -> dict:
    """`perfdiag analyze` results (metrics.json) over the whole run (`--full-run`) and over
    its default steady-state window."""
    doc = json.loads(Path(full).read_text())
    m = doc["metrics"]
    out = {label: _at(m, path) * scale for label, _, _, path, scale in METRICS}
    s = json.loads(Path(steady).read_text())["metrics"]
    offered = doc.get("load", {}).get("offered", {})
    out["facts"] = {
        "completed": int(m["outcomes"]["ok"]),
        "failed": int(m["outcomes"]["requests"]) - int(m["outcomes"]["ok"]),
        "duration_s": float(m["window"]["duration_s"]),
        "output_tokens": int(m["throughput"]["output_tokens"]),
        "itl_mean_ms": 1e3 * float(m["itl_per_chunk_s"]["mean"]),
        "prompt_tokens_mean": float(m["prompt_tokens"]["mean"]),
        "steady_output_tok_s": float(s["throughput"]["output_tokens_per_s"]),
        "steady_window": f"{s['window']['reason']}, {s['window']['duration_s']:.1f} s",
        "sent_rate_rps": offered.get("offered_rate_rps"),
        "planned_rate_rps": offered.get("planned_rate_rps"),
    }
    return out


# ---- the server's own view ------------------------------------------------------------------
# vLLM's histogram of the gaps between a request's tokens, as the engine timed them (sum and
# count: a mean over exactly the requests served between two scrapes), and its API server's
# CPU time (the process that streams, renders /metrics, adds usage to each chunk).
SERVER_SERIES = {"itl_sum": "vllm:inter_token_latency_seconds_sum",
                 "itl_count": "vllm:inter_token_latency_seconds_count",
                 "api_cpu_s": "process_cpu_seconds_total"}  # fmt: skip


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for key, name in SERVER_SERIES.items():
        m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.MULTILINE)
        out[key] = float(m.group(1)) if m else float("nan")
    return out


def server_view(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What the server recorded between two scrapes (one client's run)."""
    n = after["itl_count"] - before["itl_count"]
    return {"server_itl_mean_ms": 1e3 * (after["itl_sum"] - before["itl_sum"]) / n if n else
            float("nan"), "api_cpu_s": after["api_cpu_s"] - before["api_cpu_s"]}  # fmt: skip


def with_server(out: dict, path: Path) -> dict:
    if path.exists():
        out["facts"].update(json.loads(path.read_text()))
    return out


# ---- the table -----------------------------------------------------------------------------
def spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def fmt_cell(values: list[float]) -> str:
    med, lo, hi = spread(values)
    digits = 1 if med >= 10 else 2
    return f"{med:.{digits}f} [{lo:.{digits}f}-{hi:.{digits}f}]"


def table(load: Load, vllm: list[dict], pd_: list[dict], extras: list[dict]) -> list[str]:
    rounds = len(vllm)
    head = f"  {'metric':26} {'vLLM bench':>24} {'perfdiag':>24} {'gap':>8}  within 5 %"
    lines = [f"{load.name}: {describe(load)}; {rounds} rounds, median [min-max] over rounds", head]
    for label, unit, *_ in METRICS:
        a = [r[label] for r in vllm]
        b = [r[label] for r in pd_]
        gap = statistics.median(b) / statistics.median(a) - 1.0
        lines.append(f"  {label + f' ({unit})':26} {fmt_cell(a):>24} {fmt_cell(b):>24} "
                     f"{gap:+7.1%}  {'yes' if abs(gap) <= WITHIN else 'no'}")  # fmt: skip
    lines += facts(vllm, pd_, extras)
    return lines


def _med(rows: list[dict], key: str) -> float:
    vals = [r["facts"][key] for r in rows if r["facts"].get(key) is not None]
    return statistics.median(vals) if vals else float("nan")


def facts(vllm: list[dict], pd_: list[dict], extras: list[dict]) -> list[str]:
    """What explains throughput gaps (medians over rounds)."""
    v_win, v_span = _med(vllm, "duration_s"), _med(vllm, "first_send_to_last_s")
    v_first = _med(vllm, "first_send_s")
    out = [
        f"  window: vLLM bench {v_win:.2f} s (its start → last request done; its first send "
        f"came {v_first:.2f} s after its start), perfdiag --full-run {_med(pd_, 'duration_s'):.2f}"
        " s (first send → last completion)",
        f"  vLLM bench's own tokens over first send → last token ({v_span:.2f} s): "
        f"{_med(vllm, 'output_tok_s_over_sends'):.1f} tok/s; perfdiag's steady-state window "
        f"(its default; {pd_[0]['facts']['steady_window']}): "
        f"{_med(pd_, 'steady_output_tok_s'):.1f} tok/s",
        f"  sent rate (n-1)/send span: vLLM bench {_med(vllm, 'sent_rate_rps'):.2f} req/s, "
        f"perfdiag {_med(pd_, 'sent_rate_rps'):.2f} req/s (rounds: "
        + ", ".join(f"{r['facts']['sent_rate_rps']:.2f}" for r in pd_
                    if r["facts"].get("sent_rate_rps") is not None)
        + ")",
        f"  vLLM's own ITL mean (its histogram, per client run): vLLM bench "
        f"{_med(vllm, 'server_itl_mean_ms'):.2f} ms, perfdiag {_med(pd_, 'server_itl_mean_ms'):.2f}"
        f" ms ({_med(pd_, 'server_itl_mean_ms') / _med(vllm, 'server_itl_mean_ms') - 1:+.1%}); "
        f"client ITL mean: {_med(vllm, 'itl_mean_ms'):.2f} / {_med(pd_, 'itl_mean_ms'):.2f} ms; "
        f"its API server's CPU: {_med(vllm, 'api_cpu_s'):.2f} / {_med(pd_, 'api_cpu_s'):.2f} s",
        f"  prompt tokens the server counted (mean): vLLM bench "
        f"{_med(vllm, 'prompt_tokens_mean'):.1f}, perfdiag {_med(pd_, 'prompt_tokens_mean'):.1f};"
        f" output tokens: {_med(vllm, 'output_tokens'):.0f} / {_med(pd_, 'output_tokens'):.0f};"
        f" failed: {sum(r['facts']['failed'] for r in vllm)} / "
        f"{sum(r['facts']['failed'] for r in pd_)}",
    ]  # fmt: skip
    if extras:
        out.append(
            f"  vLLM bench asking what perfdiag asks (return_token_ids, usage in every chunk): "
            f"TPOT p50 {statistics.median(r['TPOT p50'] for r in extras):.1f} ms, vLLM's own ITL "
            f"mean {_med(extras, 'server_itl_mean_ms'):.2f} ms "
            f"({_med(extras, 'server_itl_mean_ms') / _med(vllm, 'server_itl_mean_ms') - 1:+.1%} "
            f"on plain vLLM bench), output {_med(extras, 'output_tok_s'):.1f} tok/s"
        )
    return out


def describe(load: Load) -> str:
    spacing = "constant" if load.constant else "Poisson"
    how = (f"open loop {load.rate:g} req/s ({spacing})" if load.rate is not None
           else f"closed loop of {load.concurrency}")  # fmt: skip
    return f"{how}, {load.requests} requests, input {load.prompt_len}, output {load.output_len}"


# ---- driving -------------------------------------------------------------------------------
def model_dir(venv: Path) -> str:
    out = subprocess.run([str(venv / "bin" / "python"), str(ROOT / "scripts" / "vllm_model.py")],
                         capture_output=True, text=True, check=True)  # fmt: skip
    return out.stdout.strip().splitlines()[-1]


def launch_command(venv: Path, model: str) -> str:
    """The CPU build's KV space (GiB) and thread binding in its environment; eager mode
    (no torch.compile: ~20-40 s to start instead of ~4 min on 2 cores)."""
    return (f"VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=auto {venv / 'bin' / 'vllm'} "
            f"serve {model} --served-model-name {SERVED_NAME} --enforce-eager --dtype bfloat16 "
            "--max-model-len 2048")  # fmt: skip


def run_checked(argv: list[str], what: str, env: dict | None = None,
                timeout: float = 900) -> subprocess.CompletedProcess:  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode != 0:
        tail = (done.stderr.strip() or done.stdout.strip())[-800:]
        raise RuntimeError(f"{what} failed ({done.returncode}): {tail}")
    return done


# What perfdiag asks of an OpenAI server beyond vLLM bench (probes/http_target.py EXTRAS):
# the token ids of each chunk and the running usage in every chunk.
PERFDIAG_EXTRAS = {
    "return_token_ids": True,
    "stream_options": {"include_usage": True, "continuous_usage_stats": True},
}


def vllm_bench(venv: Path, load: Load, url: str, model: str, out: Path, seed: int,
               name: str = "vllm-bench", extra_body: dict | None = None) -> Path:  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    argv = [str(venv / "bin" / "vllm"), "bench", "serve", "--backend", "vllm", "--base-url", url,
            "--endpoint", "/v1/completions", "--model", SERVED_NAME, "--tokenizer", model,
            "--dataset-name", "random", "--random-input-len", str(load.prompt_len),
            "--random-output-len", str(load.output_len), "--random-range-ratio", "0",
            "--num-prompts", str(load.requests), "--ignore-eos", "--temperature", "0",
            "--seed", str(seed), "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,90,99", "--disable-tqdm", "--save-result",
            "--save-detailed", "--result-dir", str(out), "--result-filename", f"{name}.json",
            *load.vllm_args()]  # fmt: skip
    if extra_body:
        argv += ["--extra-body", json.dumps(extra_body)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    before = scrape(url)
    done = run_checked(argv, f"vllm bench serve ({load.name})", env=env)
    write_json(out / f"{name}-server.json", server_view(before, scrape(url)))
    (out / f"{name}.log").write_text(done.stdout + done.stderr)
    if json.loads((out / f"{name}.json").read_text())["completed"] == 0:
        raise RuntimeError(f"vllm bench serve ({load.name}): every request failed; see {out}")
    return out / f"{name}.json"


def write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=1))


def perfdiag(*args: str) -> subprocess.CompletedProcess:
    return run_checked([sys.executable, "-m", "perfdiag", *args], f"perfdiag {args[0]}")


def perfdiag_run(load: Load, url: str, out: Path, seed: int) -> tuple[Path, Path]:
    run = out / "perfdiag-run"
    before = scrape(url)
    perfdiag("run", "--target", url, "-q", "-o", str(run), "-n", str(load.requests),
             "--warmup", "0", "--prompt-len", str(load.prompt_len), "--output-len",
             str(load.output_len), "--seed", str(seed), *load.perfdiag_args())  # fmt: skip
    write_json(out / "perfdiag-server.json", server_view(before, scrape(url)))
    # analyze writes results/metrics.json: its default window first, then the whole run
    perfdiag("analyze", str(run), "--no-report")
    steady = out / "perfdiag-steady.json"
    steady.write_bytes((run / "results" / "metrics.json").read_bytes())
    perfdiag("analyze", str(run), "--full-run", "--no-report")
    full = out / "perfdiag-full.json"
    full.write_bytes((run / "results" / "metrics.json").read_bytes())
    return full, steady


def warm_up(url: str, output_len: int, n: int = 2) -> None:
    """A few requests before the first round, outside both tools: neither meets a cold
    server (vLLM bench sends no test request by default; perfdiag probes with one token)."""
    body = {"model": SERVED_NAME, "prompt": list(range(100, 228)), "max_tokens": output_len,
            "temperature": 0.0, "ignore_eos": True}  # fmt: skip
    for _ in range(n):
        req = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=120) as resp:
            resp.read()


def others_running() -> list[str]:
    done = subprocess.run(["pgrep", "-af", "vllm serve"], capture_output=True, text=True)
    mine = str(os.getpid())
    return [line for line in done.stdout.splitlines() if line.split(" ", 1)[0] != mine]


def wait_alone() -> None:
    """Until no other `vllm serve` runs (one that did not take the lock, too)."""
    while others := others_running():
        print(f"waiting: another vLLM runs ({others[0][:100]}…)", file=sys.stderr, flush=True)
        time.sleep(POLL_S)


def summarise(out: Path, loads: tuple[Load, ...]) -> None:
    for load in loads:
        rounds = sorted(p for p in (out / load.name).glob("round-*") if p.is_dir())
        rounds = [p for p in rounds if (p / "perfdiag-full.json").exists()
                  and (p / "vllm-bench.json").exists()]  # fmt: skip
        if not rounds:
            continue
        vllm = [with_server(read_vllm(p / "vllm-bench.json"), p / "vllm-bench-server.json")
                for p in rounds]  # fmt: skip
        pd_ = [with_server(read_perfdiag(p / "perfdiag-full.json", p / "perfdiag-steady.json"),
                           p / "perfdiag-server.json") for p in rounds]  # fmt: skip
        extras = [with_server(read_vllm(p / "vllm-bench-extras.json"),
                              p / "vllm-bench-extras-server.json")
                  for p in rounds if (p / "vllm-bench-extras.json").exists()]  # fmt: skip
        print("\n".join(table(load, vllm, pd_, extras)))
        print()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--venv", type=Path, default=ROOT / ".venv-vllm")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--rate", type=float, default=2.0, help="the open loop's req/s")
    p.add_argument("--concurrency", type=int, default=4, help="the closed loop's clients")
    p.add_argument("--loads", default="open,closed")
    p.add_argument("--out", type=Path, default=ROOT / "build" / "vllm-bench-agreement")
    p.add_argument("--summarise", type=Path, help="print the tables of a finished benchmark")
    p.add_argument(
        "--extras-variant",
        action="store_true",
        help="also run vLLM bench asking what perfdiag asks (token ids, usage in "
        "every chunk) after each pair: is a gap the server's extra work?",
    )
    a = p.parse_args()
    common = {"requests": a.requests, "prompt_len": a.prompt_len, "output_len": a.output_len}
    all_loads = (Load("open", rate=a.rate, **common),
                 Load("closed", concurrency=a.concurrency, **common),
                 Load("constant", rate=a.rate, constant=True, **common))  # fmt: skip
    loads = tuple(ld for ld in all_loads if ld.name in a.loads.split(","))
    if a.summarise:
        summarise(a.summarise, loads)
        return

    from perfdiag.probes.server_launch import LaunchSpec, launch

    model = model_dir(a.venv)
    lock = open(LOCK, "w")  # noqa: SIM115 (held until the process ends)
    fcntl.flock(lock, fcntl.LOCK_EX)  # others' vLLM runs would skew the timings
    wait_alone()
    stamp = time.strftime("%Y%m%dT%H%M%S")
    out = a.out / stamp
    t0 = time.monotonic()
    server = launch(LaunchSpec(launch_command(a.venv, model)), out / "vllm-server.log")
    try:
        version = urllib.request.urlopen(f"{server.url}/version", timeout=10).read().decode()
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True).stdout.strip()  # fmt: skip
        print(f"vLLM bench vs perfdiag — {stamp}, perfdiag at {rev}, vLLM "
              f"{json.loads(version)['version']} (healthy after {server.startup_s:.0f} s), "
              f"{os.cpu_count()} CPUs, {a.rounds} rounds, loads: "
              f"{', '.join(ld.name for ld in loads)}", flush=True)  # fmt: skip
        warm_up(server.url, a.output_len)
        for r in range(a.rounds):
            for load in loads:
                where = out / load.name / f"round-{r}"
                load1 = os.getloadavg()[0]
                t = time.monotonic()
                v = read_vllm(vllm_bench(a.venv, load, server.url, model, where, seed=r))
                tv = time.monotonic() - t
                t = time.monotonic()
                d = read_perfdiag(*perfdiag_run(load, server.url, where, seed=r))
                td = time.monotonic() - t
                if a.extras_variant:
                    vllm_bench(a.venv, load, server.url, model, where, seed=r,
                               name="vllm-bench-extras", extra_body=PERFDIAG_EXTRAS)  # fmt: skip
                print(f"round {r} {load.name:6}: TTFT p50 {v['TTFT p50']:.1f} / "
                      f"{d['TTFT p50']:.1f} ms, TPOT p50 {v['TPOT p50']:.2f} / "
                      f"{d['TPOT p50']:.2f} ms, output {v['output throughput']:.1f} / "
                      f"{d['output throughput']:.1f} tok/s (vLLM bench / perfdiag; "
                      f"{tv:.0f} s / {td:.0f} s with start-up and analysis; load avg before "
                      f"{load1:.2f})", flush=True)  # fmt: skip
    finally:
        server.stop()
    print(f"(all in {time.monotonic() - t0:.0f} s)\n")
    summarise(out, loads)


if __name__ == "__main__":
    main()
