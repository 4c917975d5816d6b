"""Tensor parallelism (engine_ref/parallel.py): TP = 2 equals TP = 1 token for token and
in logits, collectives carry the right bytes on every rank, and no worker outlives its
engine (closed, failed, killed, interrupted)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from perfdiag.engine_ref import EngineConfig, LLMEngine, ModelConfig, SamplingParams
from perfdiag.engine_ref.config import CacheConfig, SchedulerConfig
from perfdiag.engine_ref.hooks import EngineObserver
from perfdiag.errors import ConfigError

PROMPTS = ["Hello world", "The quick brown fox jumps over", "abc", "tensor parallel " * 5]


class Records(EngineObserver):
    def __init__(self) -> None:
        self.collectives, self.rank_steps, self.steps = [], [], []

    def on_collectives(self, events) -> None:
        self.collectives += events

    def on_rank_steps(self, events) -> None:
        self.rank_steps += events

    def on_step(self, event) -> None:
        self.steps.append(event)


def _config(preset: str, tp: int, **kw) -> EngineConfig:
    sched = SchedulerConfig(chunk_size=kw.pop("chunk_size", 512))
    return EngineConfig(model=ModelConfig.preset(preset), tensor_parallel_size=tp,
                        scheduler=sched, **kw)  # fmt: skip


def _generate(engine: LLMEngine, logits: list | None = None, max_tokens: int = 16):
    if logits is not None:  # keep every step's logits
        forward = engine.runner.forward

        def keep(inp, all_logits=False):
            out = forward(inp, all_logits)
            logits.append(out.clone())
            return out

        engine.runner.forward = keep
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [o.token_ids for o in engine.generate(PROMPTS, params)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for our purposes
        return f.read().split(") ", 1)[1][0] != "Z"


def _wait_gone(pids, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_tp2_equals_tp1_tokens_and_logits(preset):
    ref_logits, tp_logits = [], []
    one = LLMEngine(_config(preset, 1, chunk_size=8))
    want = _generate(one, ref_logits)
    rec = Records()
    with LLMEngine(_config(preset, 2, chunk_size=8), observer=rec) as two:
        got = _generate(two, tp_logits)
    assert got == want
    assert len(tp_logits) == len(ref_logits)
    for a, b in zip(ref_logits, tp_logits, strict=True):
        torch.testing.assert_close(b, a, atol=2e-4, rtol=1e-4)
    # Collectives: 2 all-reduces per layer per step on each rank, each of the step's
    # [tokens, hidden] fp32 activations, the same seq on both ranks one collective.
    cfg = one.config.model
    per_step = 2 * cfg.num_layers
    assert len(rec.collectives) == 2 * per_step * len(rec.steps)
    tokens = {s.step_id: s.num_prefill_tokens + s.num_decode_seqs for s in rec.steps}
    for c in rec.collectives:
        assert c.name == "all_reduce" and c.group == "tp"
        assert c.nbytes == tokens[c.step_id] * cfg.hidden_size * 4
        assert c.end_ns >= c.start_ns
    keys = {(c.rank, c.step_id, c.seq) for c in rec.collectives}
    assert keys == {(r, s, q) for r in (0, 1) for s in tokens for q in range(per_step)}
    assert {(e.rank, e.step_id) for e in rec.rank_steps} == {(1, s) for s in tokens}


def test_tp_swap_preemption_matches():
    """Swap copies made while scheduling reach the workers' caches too."""
    cache = CacheConfig(block_size=4, num_gpu_blocks=36, num_cpu_blocks=200, watermark=0.0)
    sched = SchedulerConfig(chunk_size=16, max_num_batched_tokens=64, decode_reserve_tokens=0,
                            preemption_mode="swap")  # fmt: skip
    kw = dict(model=ModelConfig.preset("tiny"), cache=cache, scheduler=sched)
    want = _generate(LLMEngine(EngineConfig(**kw)), max_tokens=40)
    rec = Records()
    with LLMEngine(EngineConfig(**kw, tensor_parallel_size=2), observer=rec) as two:
        got = _generate(two, max_tokens=40)
    assert got == want
    assert sum(s.num_preemptions for s in rec.steps) > 0
    assert any(s.cpu_blocks_used for s in rec.steps)  # swapped, not recomputed


def test_tp_refuses_what_does_not_split():
    with pytest.raises(ConfigError, match="num_kv_heads"):
        _config("tiny", 4)  # 2 KV heads over 4 ranks
    with pytest.raises(ConfigError, match="float weights"):
        _config("tiny", 2, weight_format="q8_0")


def test_close_stops_workers_and_a_dead_worker_fails_the_step():
    engine = LLMEngine(_config("tiny", 2))
    pids = engine.tp.pids
    assert all(_alive(p) for p in pids)
    engine.close()
    assert _wait_gone(pids)
    engine.close()  # idempotent

    engine = LLMEngine(_config("tiny", 2))
    pids = engine.tp.pids
    os.kill(pids[0], signal.SIGKILL)
    _wait_gone(pids)
    with pytest.raises(RuntimeError, match="rank 1"):
        engine.generate(["Hello"], SamplingParams(max_tokens=4))
    engine.close()
    # The process group is torn down: another TP engine can start in this process.
    with LLMEngine(_config("tiny", 2)) as again:
        assert again.generate(["Hi"], SamplingParams(max_tokens=2))[0].token_ids


_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from perfdiag.engine_ref import EngineConfig, LLMEngine, ModelConfig, SamplingParams
    engine = LLMEngine(EngineConfig(model=ModelConfig.preset("tiny"), tensor_parallel_size=2))
    print(*engine.tp.pids, flush=True)
    while True:
        engine.generate(["Hello world"], SamplingParams(max_tokens=8))
    """
)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_workers_die_with_rank0(sig):
    """Rank 0 killed (no cleanup at all) or interrupted mid-step: no worker remains."""
    p = subprocess.Popen([sys.executable, "-c", _SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(x) for x in p.stdout.readline().split()]
        assert pids and all(_alive(x) for x in pids)
        time.sleep(0.5)  # inside the generate loop
        p.send_signal(sig)
        p.wait(30)
        assert _wait_gone(pids)
    finally:
        if p.poll() is None:
            p.kill()


def test_tp_run_records_every_rank(cli, tmp_path):
    """`perfdiag run --tp 2`: the run holds both ranks' collectives with their bytes, the
    workers' forwards and the clock alignment."""
    from perfdiag import load_run
    from perfdiag.analyzers import collectives

    out = tmp_path / "run"
    args = ("--preset", "tiny", "-n", "3", "--prompt-len", "12", "--output-len", "4",
            "--no-device-sampling")  # fmt: skip
    result = cli("run", *args, "--tp", "2", "--out", out)
    assert result.returncode == 0, result.stderr
    run = load_run(out)
    par = run.manifest.config["parallel"]
    assert par["tensor_parallel_size"] == 2 and par["backend"] == "gloo"
    assert [c["rank"] for c in par["clock_sync"]] == [0, 1]
    assert all(c["uncertainty_ns"] >= 0 for c in par["clock_sync"])
    sp = run.spans
    comm = sp[(sp["category"] == "comm").to_numpy()]
    steps = run.steps
    assert set(steps["rank"].dropna()) == {0}
    assert set(comm["rank"]) == {0, 1}
    hidden = ModelConfig.preset("tiny").hidden_size
    n = steps["num_prefill_tokens"] + steps["num_decode_seqs"]
    tokens = dict(zip(steps["step_id"], n, strict=True))
    for step_id, nbytes in zip(comm["step_id"], comm["bytes"], strict=True):
        assert nbytes == tokens[step_id] * hidden * 4
    assert len(comm) == 2 * 2 * ModelConfig.preset("tiny").num_layers * len(steps)
    fwd = sp[(sp["name"] == "tp_forward").to_numpy()]
    assert set(fwd["rank"]) == {1} and len(fwd) == len(steps)
    s = collectives.summarize(run)
    assert s.ranks == 2 and s.steps == len(steps) and 0 < s.comm_share < 1
    assert abs(s.wait_share + s.transfer_share - 1) < 0.05
    # host evidence per rank: the workers' CPU over each forward, every call's CPU time
    assert all(json.loads(a)["cpu_time_ns"] >= 0 for a in fwd["args"])
    assert all("cpu_time_ns" in json.loads(a) for a in comm["args"])
    assert set(s.hosts) == {0, 1} and s.hosts[1].cpu_per_s >= 0
    # the export: each rank its own CPU lane, every collective linked across the ranks
    trace = tmp_path / "trace.json"
    assert cli("export", out, "-f", "chrome", "-o", trace).returncode == 0
    events = json.loads(trace.read_text())["traceEvents"]
    starts = [e for e in events if e.get("ph") == "s" and e.get("name") == "collective"]
    assert len(starts) == len(comm) // 2
    groups = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert {"CPU · rank 0", "CPU · rank 1"} <= groups
    # the TUI's resources screen: a lane per rank (it crashed on the workers' thread-less spans)
    from perfdiag.tui.data import RunData
    from perfdiag.tui.data_resources import build_lanes

    names = {lane.name for lane in build_lanes(RunData(run)).lanes}
    assert {"r0 comm", "r1 host"} <= names


def test_interrupted_tp_run_is_kept_and_leaves_no_worker(tmp_path):
    """SIGTERM (the CLI's Ctrl-C) mid-run: the run is `interrupted`, both ranks' records
    are kept, and the worker is gone."""
    from perfdiag import load_run

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "perfdiag", "run", "--preset", "tiny", "--tp", "2", "-n", "400",
           "--prompt-len", "32", "--output-len", "16",
           "-q", "--no-device-sampling", "--out", str(out)]  # fmt: skip
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        kids: list[int] = []
        while time.monotonic() < deadline and not (kids and (out / "manifest.json").exists()):
            time.sleep(0.2)
            with open(f"/proc/{p.pid}/task/{p.pid}/children") as f:
                kids = [int(x) for x in f.read().split()]
        time.sleep(2.0)  # recording steps
        p.send_signal(signal.SIGTERM)
        p.wait(60)
        assert _wait_gone(kids)
    finally:
        if p.poll() is None:
            p.kill()
    run = load_run(out)
    assert run.manifest.status == "interrupted"
    assert set(run.spans["rank"].dropna()) == {0, 1}
