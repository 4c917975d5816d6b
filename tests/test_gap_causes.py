"""GPU idle-gap causes from evidence: for each gap, what the work after it waited for — its
launch (a late launch call: sync, host_bound, no_work), a synchronisation or event on the
host, another stream's work (a stream-wait-event on its stream), a collective's peer, a
CUDA-graph launch — in that order, and `unexplained` when work launched long before sat
queued on an idle GPU past any plausible launch latency, or started before its launch
call (the clocks disagree). Only what is left is launch delay.

One synthetic trace holds one segment per cause (times in µs past T0_US):

    A  k_a0 20-2000; cudaGraphLaunch 1000 (graph_a1 60000-61000, graph_a2 61000-159000);
       the host sits in cudaDeviceSynchronize 2000-160000: gap 2000-60000 → host_wait
    B  b0 200010-200500; cudaGraphLaunch 200100 (graph_b1 200550-200600) → graph
    C  c0 300010-300500 on stream 7; c1 launched 300020 on stream 20, which waits on an
       event at 300030; c1 runs 300700-300800 → stream_wait
    D  d0 400010-400500; an NCCL all-reduce launched 400020 runs 402000-402100 → peer_wait
    E  e0 500010-500500; e1 launched 500020 runs 505500-505600 (5 ms queued) → unexplained
    F  f0 600010-600500; f1 launched 600020 runs 600540-600600 → launch_delay
    G  g0 700010-700500; g1 runs 700600-700700, its launch call is at 700800 → unexplained
"""

import json

import pytest

import perfdiag
from perfdiag.analyzers.report import timeline_report
from perfdiag.traces.importers.kineto import import_kineto

T0_US = 1_700_000_000_000_000
CPU = {"pid": 100, "tid": 100}


class _Trace:
    def __init__(self) -> None:
        self.events: list = []
        self.corr = 0

    def call(self, name: str, ts: float, dur: float = 5, corr: int | None = None) -> int:
        if corr is None:
            self.corr += 1
            corr = self.corr
        args = {"correlation": corr}
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, **CPU,
                            "ts": T0_US + ts, "dur": dur, "args": args})  # fmt: skip
        return corr

    def kernel(self, name: str, corr: int, start: float, end: float, stream: int = 7) -> None:
        args = {"correlation": corr, "device": 0, "stream": stream}
        self.events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream,
                            "ts": T0_US + start, "dur": end - start, "args": args})  # fmt: skip

    def launch(self, name: str, at: float, start: float, end: float, stream: int = 7) -> None:
        self.kernel(name, self.call("cudaLaunchKernel", at), start, end, stream)

    def write(self, path, end_us: float):
        step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", **CPU,
                "ts": T0_US, "dur": end_us}  # fmt: skip
        doc = {"schemaVersion": 1, "traceEvents": [step, *self.events],
               "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]}  # fmt: skip
        path.write_text(json.dumps(doc))
        return path


def _graph_behind_sync(t: _Trace) -> None:
    t.launch("k_a0", 10, 20, 2000)
    graph = t.call("cudaGraphLaunch", 1000, 10)
    t.call("cudaDeviceSynchronize", 2000, 158_000)
    t.kernel("graph_a1", graph, 60_000, 61_000)
    t.kernel("graph_a2", graph, 61_000, 159_000)


def _all_causes(path):
    t = _Trace()
    _graph_behind_sync(t)
    t.launch("b0", 200_000, 200_010, 200_500)
    t.kernel("graph_b1", t.call("cudaGraphLaunch", 200_100), 200_550, 200_600)
    t.launch("c0", 300_000, 300_010, 300_500)
    t.launch("c1", 300_020, 300_700, 300_800, stream=20)
    t.events.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0,
                     "tid": 20, "ts": T0_US + 300_030, "dur": 1,
                     "args": {"device": 0, "stream": 20, "wait_on_stream": 7}})  # fmt: skip
    t.launch("d0", 400_000, 400_010, 400_500)
    t.launch("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 400_020, 402_000, 402_100)
    t.launch("e0", 500_000, 500_010, 500_500)
    t.launch("e1", 500_020, 505_500, 505_600)
    t.launch("f0", 600_000, 600_010, 600_500)
    t.launch("f1", 600_020, 600_540, 600_600)
    t.launch("g0", 700_000, 700_010, 700_500)
    t.kernel("g1", t.call("cudaLaunchKernel", 700_800), 700_600, 700_700)
    return t.write(path, 800_000)


@pytest.fixture(scope="module")
def causes(tmp_path_factory):
    root = tmp_path_factory.mktemp("gapcauses")
    import_kineto([_all_causes(root / "t.json")], root / "run")
    g = timeline_report(perfdiag.load_run(root / "run")).gaps
    return g.set_index(g["next_op"].astype(str))


def test_a_graph_launch_gap_behind_a_host_synchronize_is_not_launch_delay(causes):
    row = causes.loc["graph_a1"]
    assert row["cause"] == "host_wait"
    assert row["waited_on"] == "cudaDeviceSynchronize"
    assert row["dur_ns"] == 58_000_000


@pytest.mark.parametrize(
    ("next_op", "cause", "waited_on"),
    [
        ("graph_b1", "graph", "cudaGraphLaunch"),
        ("c1", "stream_wait", "Stream Wait Event"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "peer_wait",
         "ncclDevKernel_AllReduce_Sum_f32_RING_LL"),
        ("e1", "unexplained", "queued 5.48 ms"),
        ("f1", "launch_delay", "cudaLaunchKernel"),
        ("g1", "unexplained", "starts before its launch"),
    ],
)  # fmt: skip
def test_each_cause_from_its_evidence(causes, next_op, cause, waited_on):
    row = causes.loc[next_op]
    assert (row["cause"], row["waited_on"]) == (cause, waited_on)


def test_late_launches_keep_their_host_causes(causes):
    # b0 was launched at 200000, after the GPU ran dry at 159000 with the host in its sync
    assert causes.loc["b0", "cause"] == "sync"


def test_no_graph_or_fusion_advice_for_work_a_graph_launched(tmp_path, cli):
    t = _Trace()
    _graph_behind_sync(t)
    trace = t.write(tmp_path / "t.json", 160_000)
    assert cli("import", trace, "-o", tmp_path / "run").returncode == 0
    from perfdiag.analyzers.serving import analyze_serving, to_jsonable
    from perfdiag.playbooks.evaluate import run_triage
    from perfdiag.playbooks.facts import TriageContext
    from perfdiag.traces.reader import load_run

    run = load_run(tmp_path / "run")
    findings = to_jsonable(run_triage(TriageContext(run, analyze_serving(run))))["findings"]
    fired = {f["check"]: f for f in findings if f["severity"] != "info"}
    assert "gpu-idle-launch" not in fired
    wait = fired["gpu-idle-dependency"]
    assert wait["severity"] == "warning"  # 58 of 160 ms: 36 %
    text = json.dumps([wait["title"], wait["explanation"], *wait["recommendations"]])
    assert "cudaDeviceSynchronize" in text
    for word in ("CUDA graph", "fuse", "torch.compile"):
        assert word not in text, text
