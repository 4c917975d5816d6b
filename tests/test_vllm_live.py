"""A real vLLM (the CPU build, serving SmolLM2-135M) launched by `perfdiag run --launch`, one
everyday fault at a time: each must be named first, with advice in vLLM's own flags, and a
light load must raise nothing critical (issue 34's acceptance; docs/serving.md). The cases
are benchmarks/vllm_diagnosis.py's (which also verifies the advice by relaunching).

Opt-in: `make test-vllm` (it sets PERFDIAG_VLLM to the environment `make vllm` builds).
Each case launches vLLM (~20-40 s on 2 cores) and drives it for 20-90 s. With
PERFDIAG_VLLM_KEEP=DIR each run is also copied to DIR/<case> (how tests/data/vllm/runs/,
which CI's tests read without vLLM, was recorded).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

VENV = os.environ.get("PERFDIAG_VLLM")
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not VENV, reason="needs `make vllm` (make test-vllm sets PERFDIAG_VLLM)"),
]
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks/ is not a package perfdiag installs
from benchmarks.vllm_diagnosis import CASES, model_dir, perfdiag, record  # noqa: E402

# The flag each fault's advice must name.
FLAGS = {
    "seq-cap": "--max-num-seqs",
    "kv-pressure": "--num-gpu-blocks-override",
    "budget-sliced": "--max-num-batched-tokens",
    "prefix-off": "--enable-prefix-caching",
}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_fault_is_named_first_in_vllms_terms(case, tmp_path):
    out = tmp_path / "run"
    record(Path(VENV), case, model_dir(Path(VENV)), out)
    done = perfdiag("analyze", str(out), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["server"]["kind"] == "vllm"
    assert "engine" not in manifest["config"]["run_options"]  # the server's, not engine_ref's
    keep = os.environ.get("PERFDIAG_VLLM_KEEP")
    if keep:
        shutil.copytree(out, Path(keep) / case.name, dirs_exist_ok=True)
    findings = json.loads((out / "results" / "findings.json").read_text())
    if case.name.startswith("spec-"):
        _speculation_is_read_from_vllms_counters(out, findings)
    if case.expect is None:
        assert not [f["check"] for f in findings["findings"] if f["severity"] == "critical"]
        return
    top = next(f for f in findings["findings"] if f["check"] == findings["top"])
    assert top["check"] == case.expect, top["title"]
    assert FLAGS[case.name] in " ".join(top["recommendations"])


def _speculation_is_read_from_vllms_counters(out: Path, findings: dict) -> None:
    """spec-acceptance comes from vLLM's spec_decode counters over the run (issue 38): its
    acceptance is their accepted / draft tokens, one figure per draft position."""
    from perfdiag.analyzers.speculative import from_server
    from perfdiag.playbooks.facts import TriageContext
    from perfdiag.playbooks.facts_target import server_record
    from perfdiag.traces.reader import load_run

    f = next(f for f in findings["findings"] if f["check"] == "spec-acceptance")
    ev = {e["name"]: e["value"] for e in f["evidence"]}
    assert ev["source"].startswith("server metrics (vllm:spec_decode_num_drafts_total")
    sm = server_record(TriageContext(load_run(out)))[0]
    drafted, accepted = sm.counters["spec_draft_tokens"], sm.counters["spec_accepted_tokens"]
    assert drafted > 0 and ev["acceptance"] == pytest.approx(accepted / drafted)
    k = from_server(sm).k
    assert len(ev["by_position"].split(", ")) == k
