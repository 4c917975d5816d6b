"""perfdiag against a server no one here wrote: llama.cpp's OpenAI server (llama-cpp-python)
with the real SmolLM2 model, and beside aiperf on it.

Opt-in: `make test-third-party` builds the tools' own environment (llama.cpp compiles from
source, ~15 minutes on 2 cores) and sets PERFDIAG_THIRD_PARTY; without it these are skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV = os.environ.get("PERFDIAG_THIRD_PARTY")
pytestmark = [
    pytest.mark.third_party,
    pytest.mark.skipif(
        not VENV or not (ROOT / VENV / "bin" / "aiperf").exists(),
        reason="opt-in: `make test-third-party` (aiperf and llama.cpp's server in their own venv)",
    ),
]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmark's server and aiperf helpers

PERFDIAG = str(Path(sys.executable).parent / "perfdiag")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    import agreement

    tmp = tmp_path_factory.mktemp("llama")
    prompts, aiperf_prompts = agreement.write_prompts(6, tmp)
    with agreement.llama_cpp_server(tmp / "server.log") as (url, _):
        yield url, prompts, aiperf_prompts, tmp


def _perfdiag_run(url, prompts, out, concurrency):
    cmd = [PERFDIAG, "run", "--target", url, "--replay", str(prompts), "-n", "6",
           "--warmup", "0", "--closed", "-c", str(concurrency), "-q", "-o", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_perfdiag_measures_llama_cpp_and_says_what_it_cannot_see(llama):
    from perfdiag import load_run

    url, prompts, _, tmp = llama
    _perfdiag_run(url, prompts, tmp / "run", concurrency=2)
    run = load_run(tmp / "run")
    assert (run.requests["finish_reason"].isin(["length", "stop"])).all()
    args = [json.loads(a)["http"] for a in run.requests["args"]]
    # llama-cpp-python takes only UUIDs as x-request-id, and streams text without usage:
    # one token per non-empty text chunk is all a client can count.
    assert all(uuid.UUID(a["request_id_sent"]) for a in args)
    assert {a["token_counts"] for a in args} == {"chunks"}
    report = subprocess.run([PERFDIAG, "analyze", str(tmp / "run"), "--json"],
                            capture_output=True, text=True, check=True)  # fmt: skip
    m = json.loads(report.stdout)["metrics"]
    assert m["basis"] == "client" and m["ttft_s"]["count"] >= 4
    text = subprocess.run([PERFDIAG, "analyze", str(tmp / "run")], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip
    assert "client view" in text and "not evaluated" in text  # no engine inside: said, not guessed


def test_perfdiag_and_aiperf_agree_on_llama_cpp(llama):
    import agreement
    from aiperf_anchor import aiperf_bin

    url, prompts, aiperf_prompts, tmp = llama
    load = {"requests": 6, "concurrency": 1}  # one at a time: each request's cost is its own
    ours = agreement.perfdiag_view(url, load, prompts, tmp / "agree-perfdiag")
    tok = agreement.GGUFTokenizer(agreement.preset_file("smollm2-135m")).save_hf(tmp / "tok")
    theirs = agreement.aiperf_view(aiperf_bin(), url, load, aiperf_prompts,
                                   tmp / "agree-aiperf", tok, server_counts=False)  # fmt: skip
    assert ours["ok"] == theirs["ok"] == 6
    # Same prompts, greedy: the same tokens, counted the same by both tools.
    assert ours["out_tokens"] == pytest.approx(theirs["out_tokens"], rel=0.05)
    # Same definitions (docs/metrics.md): per-request TPOT and E2E agree to within noise.
    assert ours["tpot_mean"] == pytest.approx(theirs["tpot_mean"], rel=0.25)
    assert ours["e2e_p50"] == pytest.approx(theirs["e2e_p50"], rel=0.25)
