"""aiperf (NVIDIA's OpenAI-API load generator) as the anchor of perfdiag's client benchmarks.

aiperf lives in its own environment (`make third-party` builds `.venv-third-party`): its
dependencies are not perfdiag's. A run is one `aiperf profile` subprocess; its per-request
records (`profile_export.jsonl`) are read back as a DataFrame in aiperf's own definitions:

  start_ns / end_ns   request start / end (wall clock, ns: aiperf's `request_start_ns`)
  ttft_s              time_to_first_token (request start → first content response)
  e2e_s               request_latency (request start → last response)
  itl_s               inter_token_latency: (e2e − ttft) / (output tokens − 1), per request
  output_tokens       output_token_count (server-reported with --use-server-token-count)
  ok                  no error recorded
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BIN = ROOT / ".venv-third-party" / "bin" / "aiperf"


def aiperf_bin() -> Path | None:
    """The aiperf executable: $PERFDIAG_AIPERF, the project's third-party venv, or PATH."""
    for candidate in (os.environ.get("PERFDIAG_AIPERF"), DEFAULT_BIN, shutil.which("aiperf")):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def aiperf_version(exe: Path) -> str:
    python = exe.parent / "python"
    code = "import importlib.metadata as m; print(m.version('aiperf'))"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


@dataclass(frozen=True)
class AiperfLoad:
    """One load: open loop at `rate` (constant arrivals) or closed loop at `concurrency`."""

    requests: int
    rate: float | None = None
    concurrency: int | None = None


@dataclass
class AiperfRun:
    records: pd.DataFrame
    out_dir: Path


def run_aiperf(
    exe: Path,
    url: str,
    model: str,
    load: AiperfLoad,
    out_dir: Path,
    *,
    tokenizer: Path,
    input_file: Path | None = None,
    prompt_tokens: int = 16,
    output_tokens: int = 8,
    extra_inputs: dict | None = None,
    server_token_count: bool = True,
    endpoint_type: str = "completions",
    timeout_s: float = 600,
) -> AiperfRun:
    """Run `aiperf profile` once; raise RuntimeError with its last lines if it fails."""
    cmd = [str(exe), "profile", "--model", model, "--url", url,
           "--endpoint-type", endpoint_type, "--streaming",
           "--request-count", str(load.requests), "--tokenizer", str(tokenizer),
           "--ui", "none", "--output-artifact-dir", str(out_dir),
           "--random-seed", "7",
           # Its /metrics scraper is an optional process that, starved on 2 cores, misses
           # heartbeats and fails the whole run; perfdiag scrapes the target on its own.
           "--no-server-metrics"]  # fmt: skip
    if server_token_count:  # else the tokenizer counts the streamed text
        cmd.append("--use-server-token-count")
    if load.rate is not None:
        cmd += ["--request-rate", f"{load.rate:g}", "--arrival-pattern", "constant"]
    if load.concurrency is not None:
        cmd += ["--concurrency", str(load.concurrency)]
    if input_file is not None:
        cmd += ["--input-file", str(input_file), "--custom-dataset-type", "single_turn",
                "--dataset-sampling-strategy", "sequential"]  # fmt: skip
    else:
        cmd += ["--prompt-input-tokens-mean", str(prompt_tokens),
                "--prompt-input-tokens-stddev", "0",
                "--prompt-output-tokens-mean", str(output_tokens),
                "--prompt-output-tokens-stddev", "0"]  # fmt: skip
    if extra_inputs:
        cmd += ["--extra-inputs", json.dumps(extra_inputs)]
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    records_file = out_dir / "profile_export.jsonl"
    for _ in range(2):  # once more after a failure: its many processes share 2 cores
        shutil.rmtree(out_dir, ignore_errors=True)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                              cwd=out_dir.parent)  # fmt: skip
        if done.returncode == 0 and records_file.exists():
            break
    else:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"aiperf failed (exit {done.returncode}):\n{tail}")
    return AiperfRun(read_records(records_file), out_dir)


def read_records(path: Path) -> pd.DataFrame:
    rows = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        meta, metrics = rec.get("metadata", {}), rec.get("metrics", {})

        def value(name, scale=1e-3, metrics=metrics):
            m = metrics.get(name)
            return None if m is None or m.get("value") is None else m["value"] * scale

        rows.append({
            "start_ns": meta.get("request_start_ns"),
            "end_ns": meta.get("request_end_ns"),
            "ttft_s": value("time_to_first_token"),
            "e2e_s": value("request_latency"),
            "itl_s": value("inter_token_latency"),
            "output_tokens": value("output_token_count", 1),
            "ok": not rec.get("error") and not meta.get("was_cancelled", False),
        })  # fmt: skip
    return pd.DataFrame(rows)
