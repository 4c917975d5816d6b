"""GPU idle findings on traces: each idle cause the timeline classes (launch delay, host
busy, sync, no work, unlinked) raises a finding with a check to do, and a bare trace (no
requests, no engine steps) gets no inference-only advice and no "not reproducible" above
a real cause."""

import json

T0_US = 1_700_000_000_000_000


def _trace(path, comm: bool = False):
    """One ProfilerStep of 1000 µs: ten 10 µs kernels all launched at its start, so each
    waits 40 µs after the one before with its launch long issued (launch delay)."""
    cpu = {"pid": 100, "tid": 100}
    gpu = {"pid": 0, "tid": 7}
    events = [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#1",
            **cpu,
            "ts": T0_US,
            "dur": 1000,
        }
    ]
    for k in range(10):
        events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                **cpu,
                "ts": T0_US + 1 + k,
                "dur": 1,
                "args": {"correlation": k + 1},
            }
        )
        name = "ncclKernel_AllReduce_RING_LL_Sum_float" if comm and k == 9 else f"kernel_{k}"
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": name,
                **gpu,
                "ts": T0_US + 100 + 50 * k,
                "dur": 10,
                "args": {"correlation": k + 1, "device": 0, "stream": 7},
            }
        )
    doc = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
        "traceEvents": events,
    }
    path.write_text(json.dumps(doc))
    return path


def test_launch_delay_raises_a_finding_with_a_check(tmp_path, cli):
    trace = _trace(tmp_path / "t.json")
    assert cli("import", trace, "-o", tmp_path / "run").returncode == 0
    from perfdiag.analyzers.serving import analyze_serving, to_jsonable
    from perfdiag.playbooks.evaluate import run_triage
    from perfdiag.playbooks.facts import TriageContext
    from perfdiag.traces.reader import load_run

    run = load_run(tmp_path / "run")
    findings = to_jsonable(run_triage(TriageContext(run, analyze_serving(run))))["findings"]
    by_check = {f["check"]: f for f in findings}
    launch = by_check["gpu-idle-launch"]
    assert launch["severity"] == "warning"  # 9 × 40 µs of a 1000 µs step: 36 %
    assert abs(launch["value"] - 0.36) < 1e-9
    assert any("CUDA graph" in r for r in launch["recommendations"])
    real = [f for f in findings if f["severity"] != "info"]
    assert real[0]["check"] == "gpu-idle-launch"  # nothing of the gate outranks it
    assert by_check["not-reproducible"]["severity"] == "info"
    text = json.dumps(findings)
    assert "tensor-parallel" not in text
