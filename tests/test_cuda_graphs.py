"""CUDA graphs for decode steps. On the CPU the graph runner's emulate mode runs the same
static-buffer path (padding rows with slot −1 and length 0, stale table entries, bucket
choice, fallbacks) through the interpreted kernels; on CUDA (gpu mark) real capture and
replay are checked against the CPU reference's greedy tokens."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from perfdiag.engine_ref import DenseReference, LLMEngine
from perfdiag.engine_ref.cuda_graphs import DecodeGraphs
from perfdiag.engine_ref.kernels import launch
from perfdiag.engine_ref.kernels._common import interpreting
from perfdiag.engine_ref.testing import run, tiny_config, workload

ITEMS = workload(n=7, seed=4, max_prompt=20)


@pytest.fixture(scope="module")
def torch_tokens():
    return run(LLMEngine(tiny_config()), ITEMS, per_step=3).tokens


def _emulated(sizes, fail=()):
    engine = LLMEngine(replace(tiny_config(), kernel_backend="triton"))
    graphs = DecodeGraphs(engine.runner, sizes, engine.config.max_model_len, mode="emulate")
    real = graphs._capture

    def capture(b):
        if b in fail:
            raise RuntimeError("capture refused (test)")
        return real(b)

    graphs._capture = capture
    engine.runner.graphs = graphs.capture()
    return engine, graphs


@pytest.mark.skipif(not interpreting(), reason="needs TRITON_INTERPRET=1")
def test_emulated_graphs_pad_and_fall_back_without_changing_tokens(torch_tokens):
    # size 2 fails to capture (batches of 1-2 pad to 3); batches above 3 run eagerly
    engine, graphs = _emulated((1, 2, 3), fail=(1, 2))
    assert set(graphs.failed) == {1, 2} and graphs.size_for(1) == 3 and graphs.size_for(4) is None
    replays = []

    class Probe:  # a launch observer sees one replay per graph step, no kernel launch in it
        def on_launch(self, kernel, grid, args, meta, cost):
            kernel[grid](*args, **meta)

        def on_graph_replay(self, batch, size, t0, t1):
            replays.append((batch, size))

    launch.set_observer(Probe())
    try:
        got = run(engine, ITEMS, per_step=3)
    finally:
        launch.set_observer(None)
    assert got.tokens == torch_tokens
    assert graphs.replays == len(replays) > 0 and graphs.eager_fallbacks > 0
    assert all(size == 3 for _, size in replays) and any(b < 3 for b, _ in replays)
    assert engine.is_drained()


def test_graph_buffers_cover_the_longest_context():
    engine = LLMEngine(tiny_config())  # torch kernels: the runner is only read for shapes
    engine.runner.num_sms = 0
    g = DecodeGraphs(engine.runner, (4, 1, 2), max_model_len=127)
    assert g.sizes == [1, 2, 4] and g.tables.shape == (4, 32)  # ceil(127 / 4) blocks
    assert (g.slots == -1).all() and g.tables.dtype == torch.int32
    with pytest.raises(ValueError):
        DecodeGraphs(engine.runner, (1,), 8, mode="replay")


needs_cuda = pytest.mark.skipif(
    interpreting() or not torch.cuda.is_available(), reason="needs CUDA, not interpreted"
)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("graphs", [False, True])
def test_cuda_triton_engine_matches_the_cpu_reference(graphs):
    cfg = replace(tiny_config(), device="cuda", kernel_backend="triton", cuda_graphs=graphs,
                  cuda_graph_batch_sizes=(1, 2, 4))  # fmt: skip
    engine = LLMEngine(cfg)
    res = run(engine, ITEMS, per_step=3)
    ref = DenseReference(LLMEngine(tiny_config()).model)
    for i, it in enumerate(ITEMS):
        want = ref.greedy(it.prompt, it.params.max_tokens, (257,), max_model_len=128)
        assert res.tokens[f"r{i}"] == want.token_ids, f"r{i}"
    if graphs:
        assert not engine.runner.graphs.failed and engine.runner.graphs.replays > 0


@pytest.mark.gpu
@needs_cuda
def test_cuda_bf16_graph_replay_matches_eager_logits():
    from perfdiag.engine_ref.request import Request, SamplingParams

    cfg = replace(tiny_config(), device="cuda", dtype="bfloat16", kernel_backend="triton",
                  cuda_graphs=True, cuda_graph_batch_sizes=(4,))  # fmt: skip
    engine = LLMEngine(cfg)
    bm, runner = engine.block_manager, engine.runner
    reqs = []
    for i, n in enumerate((5, 9, 3)):  # three decodes, padded to the graph of 4
        r = Request(f"r{i}", tuple(range(1, n + 1)), SamplingParams(), 0, n + 2)
        bm.append_slots(r, n)
        r.num_computed_tokens = n - 1
        reqs.append((r, 1))
    inp = runner.prepare(reqs)
    graph_logits = runner.forward(inp)
    assert runner.graphs.replays == 1
    graphs, runner.graphs = runner.graphs, None
    eager = runner.forward(inp)
    runner.graphs = graphs
    # GEMMs of 4 rows vs 3 and another split count may round differently: bf16 tolerance
    torch.testing.assert_close(graph_logits, eager, atol=5e-2, rtol=2e-2)
