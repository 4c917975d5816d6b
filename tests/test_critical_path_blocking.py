"""Blocking runtime calls on the critical path (issue 36): a call that waits for device work
(a copy to or from pageable memory, a synchronous copy, a synchronize) ends after the work it
waited for, so the path runs through the device during the wait and the call keeps only
its own return latency. Paths are worked out by hand in each docstring; the shared real
traces check the rule on every blocking call they hold."""

import numpy as np
import pytest
from test_critical_path import KINETO, US, _cpu, _gpu, _parts, _path, _saved_us

from perfdiag.analyzers import blocking_calls
from perfdiag.analyzers import critical_path_graph as cg
from perfdiag.analyzers.critical_path import critical_path
from perfdiag.analyzers.timeline import windows


def _copy_trace(kind: str):
    """A 0–10, a kernel K launched 10–12 runs 15–115 on stream 7; cudaMemcpyAsync 12–120
    copies to the host, its copy 115–118 queued behind K; then B 120–130."""
    return [
        _cpu("A", 0, 10),
        _cpu("cudaLaunchKernel", 10, 12, category="cuda_runtime", correlation=1),
        _cpu("cudaMemcpyAsync", 12, 120, category="cuda_runtime", correlation=2),
        _cpu("B", 120, 130),
        _gpu("K", 15, 115, correlation=1),
        _gpu(f"Memcpy DtoH (Device -> {kind})", 115, 118, correlation=2, category="gpu_memcpy"),
    ]


def test_a_copy_to_pageable_memory_waits_for_the_device():
    """The call returns 2 after its copy: A 10, launch 5 (K starts 5 after its call),
    K 100, the copy 3 (it waited for K on its stream), the call's return 2, B 10 = 130.
    The host's 108 inside the call are the device's: no cuda_api piece. Halving K saves
    50 (the copy and the call move with it); the call has no 'halved' lever (its time
    is a wait); removing the wait (a pinned, non-blocking copy) saves 12: the host would
    be done at 24, the copy still ends at 118."""
    cp = _path(_copy_trace("Pageable"))
    assert _parts(cp) == [
        ("cpu", "A", 10),
        ("launch", "cudaLaunchKernel", 5),
        ("kernel", "K", 100),
        ("memcpy", "Memcpy DtoH (Device -> Pageable)", 3),
        ("sync", "cudaMemcpyAsync", 2),
        ("cpu", "B", 10),
    ]
    bound = cp.bound()
    assert bound["gpu compute"] == 100 * US and bound["host"] == 20 * US
    assert _saved_us(cp, "kernel", "K") == 50
    it = cp.items
    call = it[it["name"] == "cudaMemcpyAsync"]
    assert list(call["kind"]) == ["sync"] and list(call["what_if"]) == ["removed"]
    assert _saved_us(cp, "sync", "cudaMemcpyAsync") == 12


def test_a_copy_to_pinned_memory_is_host_time():
    """The same call copying to pinned memory does not wait for the copy (CUDA's rule):
    its 108 are its own (a lock, say), and the path stays on the host: A 10, the
    launch call 2, the copy call 108, B 10."""
    cp = _path(_copy_trace("Pinned"))
    assert _parts(cp) == [
        ("cpu", "A", 10),
        ("cuda_api", "cudaLaunchKernel", 2),
        ("cuda_api", "cudaMemcpyAsync", 108),
        ("cpu", "B", 10),
    ]
    assert _saved_us(cp, "cuda_api", "cudaMemcpyAsync") == 12  # the copy still ends at 118


def test_a_synchronous_copy_waits_for_its_own_copy():
    """cudaMemcpy 12–60 whose copy runs 20–55 behind nothing; another stream's kernel K2
    (launched 10–12) ends later, at 58, inside the call too. The call waited for its own
    copy, not for K2: A 10, cuda_api 2 (the launch call before it), launch 8 (copy starts
    8 after cudaMemcpy began), memcpy 35, sync 5, B 10 = 70."""
    cp = _path([
        _cpu("A", 0, 10),
        _cpu("cudaLaunchKernel", 10, 12, category="cuda_runtime", correlation=1),
        _cpu("cudaMemcpy", 12, 60, category="cuda_runtime", correlation=2),
        _cpu("B", 60, 70),
        _gpu("K2", 14, 58, correlation=1, stream=9),
        _gpu("Memcpy HtoD (Pageable -> Device)", 20, 55, correlation=2, category="gpu_memcpy"),
    ])  # fmt: skip
    assert _parts(cp) == [
        ("cpu", "A", 10),
        ("cuda_api", "cudaLaunchKernel", 2),
        ("launch", "cudaMemcpy", 8),
        ("memcpy", "Memcpy HtoD (Pageable -> Device)", 35),
        ("sync", "cudaMemcpy", 5),
        ("cpu", "B", 10),
    ]


def test_a_stream_synchronize_waits_for_its_stream():
    """cudaStreamSynchronize 20–100 on stream 7 (Kineto's 'Stream Sync' event names it):
    K7 on stream 7 runs 15–90, K9 on stream 9 runs 16–95. The call waited for K7 (its
    stream), not for K9 which ended later: A 10, launch 5, K7 75, sync 10, B 10 = 110."""
    cp = _path([
        _cpu("A", 0, 10),
        _cpu("cudaLaunchKernel", 10, 11, category="cuda_runtime", correlation=1),
        _cpu("cudaLaunchKernel", 11, 12, category="cuda_runtime", correlation=2),
        _cpu("cudaStreamSynchronize", 20, 100, category="cuda_runtime", correlation=3),
        _cpu("B", 100, 110),
        _gpu("K7", 15, 90, correlation=1),
        _gpu("K9", 16, 95, correlation=2, stream=9),
        _gpu("Stream Sync", 20, 100, correlation=3, category="cuda_sync"),
    ])  # fmt: skip
    assert _parts(cp) == [
        ("cpu", "A", 10),
        ("launch", "cudaLaunchKernel", 5),
        ("kernel", "K7", 75),
        ("sync", "cudaStreamSynchronize", 10),
        ("cpu", "B", 10),
    ]


@pytest.mark.parametrize(
    ("name", "waits"),
    [("v100_train_ns_resolution", 1), ("a100_nccl_comm", 0), ("a100_alexnet_cuda_sync", 24)],
)
def test_real_traces_give_every_wait_to_the_device(name, waits, tmp_path, cli):
    """Every blocking call whose end is on the path and that waited for device work (the
    op it waited for ended inside it) reaches the path as 'sync' (its return latency
    after that op ended), never as host time; no blocking call has a 'halved' lever.
    V100: one cudaDeviceSynchronize waits 89 ms; alexnet: 16 stream synchronizes and 8
    pageable → device copies; NCCL: no device op ends inside any of its 24
    cudaEventSynchronize or its cudaDeviceSynchronize (their few µs are the host's)."""
    cli("import", str(KINETO / f"{name}.json.gz"), "-o", str(tmp_path / "run"))
    from perfdiag.analyzers.spans import timeline_spans
    from perfdiag.traces.reader import load_run

    df = timeline_spans(load_run(tmp_path / "run"))
    g = cg.build(df)
    assert np.array_equal(cg.replay(g), g.time)
    waited = np.flatnonzero(g.kinds[:, 1] == cg.SYNC)  # end nodes of calls that waited
    assert len(waited) == waits
    wins = windows(df)
    whole = wins.head(1).assign(start_ns=int(df["start_ns"].min()), end_ns=int(df["end_ns"].max()))
    for w in (wins, whole):  # per step, and the whole trace (V100's wait is after its steps)
        _check_waits(g, waited, critical_path(df, w), whole=w is whole)


def _check_waits(g, waited, cp, whole):
    s = cp.segments
    on_path = [n for n in waited if int(g.time[n]) in set(s["end_ns"].tolist())]
    assert len(on_path) or not whole or not len(waited)
    for n in on_path:
        gpu_end = int(g.time[g.preds[n, 1]])
        piece = s[s["end_ns"] == int(g.time[n])].iloc[-1]
        assert piece["kind"] not in ("cpu", "cuda_api", "host_gap"), piece.to_dict()
        assert int(piece["start_ns"]) >= gpu_end  # only the return after the device
    assert not (cp.items["kind"].eq("sync") & cp.items["what_if"].eq("halved")).any()


def test_the_rule_names_blocking_calls():
    """What CUDA documents as waiting for the device; an async copy only to or from
    pageable memory; event queries, stream waits and launches never block the host."""
    sync = ["cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
            "hipDeviceSynchronize", "cudaMemcpy", "cuMemcpyDtoH_v2"]  # fmt: skip
    never = ["cudaEventQuery", "cudaStreamWaitEvent", "cudaLaunchKernel", "cudaMemcpyAsync"]
    assert blocking_calls.SYNC_CALL.pattern
    assert all(blocking_calls.SYNC_CALL.search(n) for n in sync)
    assert not any(blocking_calls.SYNC_CALL.search(n) for n in never)
    assert blocking_calls.is_pageable("Memcpy DtoH (Device -> Pageable)")
    assert blocking_calls.is_pageable("Memcpy HtoD (Pageable -> Device)")
    assert not blocking_calls.is_pageable("Memcpy DtoH (Device -> Pinned)")
    assert not blocking_calls.is_pageable("Memcpy DtoD (Device -> Device)")


def _pageable_steps_trace(path, steps: int = 3):
    """Kineto JSON: per 1,000 µs ProfilerStep, prep 0–50, a gemm launched 50–55 runs
    60–900, aten::copy_ 55–910 holds a cudaMemcpyAsync 56–905 whose copy to pageable
    memory runs 900–903 behind the gemm, then post 910–990."""
    import json

    from kineto_traces import CPU, GPU, T0_US

    events = []

    def x(base, name, cat, start, dur, where=CPU, **args):
        events.append({"ph": "X", "cat": cat, "name": name, **where, "ts": base + start,
                       "dur": dur, "args": args})  # fmt: skip

    for k in range(steps):
        b = T0_US + 1000 * k
        x(b, f"ProfilerStep#{k}", "user_annotation", 0, 1000)
        x(b, "prep", "cpu_op", 0, 50)
        x(b, "cudaLaunchKernel", "cuda_runtime", 50, 5, correlation=10 * k + 1)
        x(b, "gemm", "kernel", 60, 840, where=GPU, correlation=10 * k + 1, device=0, stream=7)
        x(b, "aten::copy_", "cpu_op", 55, 855)
        x(b, "cudaMemcpyAsync", "cuda_runtime", 56, 849, correlation=10 * k + 2)
        x(b, "Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 900, 3, where=GPU,
          correlation=10 * k + 2, device=0, stream=7)  # fmt: skip
        x(b, "post", "cpu_op", 910, 80)
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
           "traceEvents": events}  # fmt: skip
    path.write_text(json.dumps(doc))
    return path


def test_a_step_waiting_in_a_pageable_copy_is_gpu_bound(tmp_path, cli):
    """The issue's case: the host sits 849 µs of each 1,000 µs step in cudaMemcpyAsync
    waiting for the gemm. Per step the path is prep 50, launch 10, gemm 840, copy 3,
    the call's return 2, aten::copy_ 5, post 80 and 10 of gap: GPU compute 84 %, host
    14.5 %, and no lever halves the copy call (it was 'halving cudaMemcpyAsync' before)."""
    import json

    trace = _pageable_steps_trace(tmp_path / "t.json")
    assert cli("import", trace, "-o", tmp_path / "run").returncode == 0
    data = json.loads(cli("timeline", tmp_path / "run", "--json").stdout)["critical_path"]
    kinds = {r["kind"]: r["path_ns"] for r in data["by_kind"]}
    steps = 3
    assert kinds["kernel"] == 840_000 * steps and kinds["memcpy"] == 3_000 * steps
    assert kinds["sync"] == 2_000 * steps and kinds.get("cuda_api", 0) == 0
    assert kinds["cpu"] == (50 + 5 + 80) * 1000 * steps
    items = {(i["kind"], i["name"]): i for i in data["items"]}
    assert ("cuda_api", "cudaMemcpyAsync") not in items
    assert items[("sync", "cudaMemcpyAsync")]["what_if"] != "halved"  # (too light to replay)
    assert cli("analyze", tmp_path / "run").returncode == 0
    findings = json.loads((tmp_path / "run/results/findings.json").read_text())["findings"]
    cp = next(f for f in findings if f["check"] == "critical-path")
    assert "cudaMemcpyAsync" not in cp["title"] or "halving" not in cp["title"]
    assert "halving gemm" in cp["title"]
