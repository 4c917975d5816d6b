"""A real vLLM (the CPU build, serving SmolLM2-135M) launched by `perfdiag run --launch`, one
everyday fault at a time: each must be named first, with advice in vLLM's own flags, and a
light load must raise nothing critical (issue 34's acceptance; docs/serving.md).

Opt-in: `make test-vllm` (it sets PERFDIAG_VLLM to the environment `make vllm` builds).
Each case launches vLLM (~20-40 s on 2 cores) and drives it for 20-90 s. With
PERFDIAG_VLLM_KEEP=DIR each run is also copied to DIR/<case> (how tests/data/vllm/runs/,
which CI's tests read without vLLM, was recorded).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

VENV = os.environ.get("PERFDIAG_VLLM")
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not VENV, reason="needs `make vllm` (make test-vllm sets PERFDIAG_VLLM)"),
]
ROOT = Path(__file__).resolve().parents[1]


def _model() -> str:
    python = Path(VENV) / "bin" / "python"
    out = subprocess.run([str(python), str(ROOT / "scripts" / "vllm_model.py")],
                         capture_output=True, text=True, check=True)  # fmt: skip
    return out.stdout.strip().splitlines()[-1]


def _vllm(args: str, max_len: int = 2048) -> str:
    """The launch command: the CPU build's KV space and thread binding in its environment;
    eager mode (no torch.compile: ~40 s to start instead of ~4 min on 2 cores)."""
    vllm = Path(VENV) / "bin" / "vllm"
    return (f"VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=auto {vllm} serve {_model()} "
            f"--served-model-name smollm2 --enforce-eager --dtype bfloat16 "
            f"--max-model-len {max_len} {args}")  # fmt: skip


def _run_and_analyze(tmp_path, launch: str, workload: list[str], keep_as: str) -> dict:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "perfdiag", "run", "--launch", launch, "-q", "-o", str(out),
           *workload]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    analyzed = subprocess.run([sys.executable, "-m", "perfdiag", "analyze", str(out)],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
    assert analyzed.returncode == 0, analyzed.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["server"]["kind"] == "vllm"
    assert "engine" not in manifest["config"]["run_options"]  # the server's, not engine_ref's
    keep = os.environ.get("PERFDIAG_VLLM_KEEP")
    if keep:
        shutil.copytree(out, Path(keep) / keep_as, dirs_exist_ok=True)
    return json.loads((out / "results" / "findings.json").read_text())


def _top(findings: dict) -> dict:
    return next(f for f in findings["findings"] if f["check"] == findings["top"])


def _advice(finding: dict) -> str:
    return " ".join(finding["recommendations"])


def test_a_sequence_cap_of_two_under_sixteen_clients(tmp_path):
    findings = _run_and_analyze(
        tmp_path, _vllm("--max-num-seqs 2"),
        ["-n", "48", "--warmup", "4", "-c", "16", "--closed", "--prompt-len", "64",
         "--output-len", "32"],
        "seq-cap",
    )  # fmt: skip
    top = _top(findings)
    assert top["check"] == "server-seq-cap", top["title"]
    assert "--max-num-seqs" in _advice(top)


def test_a_kv_cache_of_twelve_blocks_under_long_outputs(tmp_path):
    findings = _run_and_analyze(
        tmp_path, _vllm("--num-gpu-blocks-override 12", max_len=1024),
        ["-n", "32", "--warmup", "4", "-c", "8", "--closed", "--prompt-len", "64",
         "--output-len", "320"],
        "kv-pressure",
    )  # fmt: skip
    top = _top(findings)
    assert top["check"] == "server-kv-pressure", top["title"]
    assert "--num-gpu-blocks-override" in _advice(top)


def test_a_small_token_budget_slices_long_prompts(tmp_path):
    findings = _run_and_analyze(
        tmp_path, _vllm("--max-num-seqs 16 --max-num-batched-tokens 32"),
        ["-n", "16", "--warmup", "2", "-c", "8", "--closed", "--prompt-len", "1024",
         "--output-len", "32"],
        "budget-sliced",
    )  # fmt: skip
    top = _top(findings)
    assert top["check"] == "server-prefill-sliced", top["title"]
    assert "--max-num-batched-tokens" in _advice(top)


def test_prefix_caching_off_on_shared_prefixes(tmp_path):
    findings = _run_and_analyze(
        tmp_path, _vllm("--no-enable-prefix-caching"),
        ["-n", "24", "--warmup", "4", "-c", "4", "--closed", "--shared-prefix", "4:512",
         "--prompt-len", "128", "--output-len", "32"],
        "prefix-off",
    )  # fmt: skip
    top = _top(findings)
    assert top["check"] == "prefix-not-reused", top["title"]
    assert "--enable-prefix-caching" in _advice(top)


def test_a_light_open_loop_raises_nothing_critical(tmp_path):
    findings = _run_and_analyze(
        tmp_path, _vllm(""),
        ["-n", "16", "--warmup", "2", "--rate", "1", "--prompt-len", "64",
         "--output-len", "32"],
        "light",
    )  # fmt: skip
    assert not [f["check"] for f in findings["findings"] if f["severity"] == "critical"]
