"""The Triton kernels on a quantised KV cache (int8, fp8) against their PyTorch references:
the store bit for bit (values and scales; CUDA-graph padding slots −1 write nothing), and
decode and prefill attention reading a QuantKV against the references reading the same
cache dequantised. Interpreted on the CPU (fp32, fp16), compiled on CUDA (`gpu` mark)."""

from __future__ import annotations

import pytest
import torch

from perfdiag.engine_ref.kernels import decode_attention as dec
from perfdiag.engine_ref.kernels import kv_store
from perfdiag.engine_ref.kernels import prefill_attention as pre
from perfdiag.engine_ref.kernels._common import interpreting
from perfdiag.engine_ref.kernels.testing import assert_close, device_cases, scattered_tables
from perfdiag.engine_ref.kv_quant import STORAGE, QuantKV, quantize

CASES = device_cases()
KINDS = ["int8", "fp8"]


def _caches(kind, blocks, block_size, kv_heads, dim, device, fill=False, seed=0):
    """K and V QuantKV caches (halves of one tensor each, as the engine's are); `fill`:
    random values quantised into every slot, else zeros."""
    data = torch.zeros((2, blocks, block_size, kv_heads, dim), dtype=STORAGE[kind], device=device)
    scale = torch.zeros((2, blocks, block_size, kv_heads), device=device)
    if fill:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn((2, blocks, block_size, kv_heads, dim), generator=g) * 3
        q, s = quantize(x, kind)
        data.copy_(q.to(device))
        scale.copy_(s.to(device))
    return QuantKV(data[0], scale[0], kind), QuantKV(data[1], scale[1], kind)


def _raw(c: QuantKV) -> torch.Tensor:
    return c.data.view(torch.uint8).cpu()


@pytest.mark.parametrize(("device", "dtype"), CASES)
@pytest.mark.parametrize("kind", KINDS)
def test_store_matches_reference_bit_for_bit(device, dtype, kind):
    heads, dim = 3, 20  # head_dim not a power of two
    g = torch.Generator().manual_seed(1)
    k = (torch.randn((9, heads, dim), generator=g) * 5).to(device=device, dtype=dtype)
    v = (torch.randn((9, heads, dim), generator=g) / 7).to(device=device, dtype=dtype)
    k[4, 1] = 0  # an all-zero head
    slots = torch.tensor([0, 5, -1, 9, 23, 14, 2, -1, 17], device=device)
    got, want = _caches(kind, 6, 4, heads, dim, device), _caches(kind, 6, 4, heads, dim, device)
    kv_store.store_kv(k, v, got[0], got[1], slots)
    kv_store.ref_store_kv(k, v, want[0], want[1], slots)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(_raw(a), _raw(b)) and torch.equal(a.scale, b.scale)
    assert (got[0].scale.view(-1, heads)[slots[slots >= 0]] > 0).all()
    untouched = torch.ones(24, dtype=torch.bool)
    untouched[slots[slots >= 0].cpu()] = False
    assert (_raw(got[0]).view(24, -1)[untouched] == 0).all()  # padding wrote nowhere


@pytest.mark.parametrize(("device", "dtype"), CASES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_attention_reads_quantised_cache(device, dtype, kind, splits):
    heads, kv_heads, dim, block_size, blocks = 6, 2, 24, 4, 48
    lens = [1, 18, 0, 71, 5]
    kc, vc = _caches(kind, blocks, block_size, kv_heads, dim, device, fill=True)
    tables = scattered_tables(lens, block_size, blocks, width=20).to(device)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=device)
    q = torch.randn((len(lens), heads, dim), generator=torch.Generator().manual_seed(5))
    q = q.to(device=device, dtype=dtype)
    got = dec.decode_attention(q, kc, vc, tables, lens_t, dim**-0.5, num_splits=splits)
    assert_close(got, dec.ref_decode_attention(q, kc, vc, tables, lens_t, dim**-0.5))
    assert torch.equal(got[2], torch.zeros_like(got[2]))


@pytest.mark.parametrize(("device", "dtype"), CASES)
@pytest.mark.parametrize("kind", KINDS)
def test_prefill_attention_reads_quantised_cache(device, dtype, kind):
    heads, kv_heads, dim, block_size, blocks = 5, 1, 40, 4, 48
    seqs = [(7, 7), (6, 11), (1, 30), (21, 29)]
    q_lens, ctx = [n for n, _ in seqs], [c for _, c in seqs]
    kc, vc = _caches(kind, blocks, block_size, kv_heads, dim, device, fill=True, seed=1)
    tables = scattered_tables(ctx, block_size, blocks, seed=2).to(device)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    cu, lens = cu.to(device), torch.tensor(ctx, dtype=torch.int32, device=device)
    q = torch.randn((sum(q_lens), heads, dim), generator=torch.Generator().manual_seed(5))
    q = q.to(device=device, dtype=dtype)
    got = pre.prefill_attention(q, kc, vc, tables, cu, lens, dim**-0.5, max(q_lens))
    assert_close(got, pre.ref_prefill_attention(q, kc, vc, tables, cu, lens, dim**-0.5))


def test_cost_models_count_kv_as_stored():
    """int8 KV at head_dim 64: 1 + 4/64 bytes an element, not the query's 4."""
    fp32 = dec.bytes_moved(2, 8, 2, 64, 1000, 4, 10)
    int8 = dec.bytes_moved(2, 8, 2, 64, 1000, 4, 10, kv_elem=1 + 4 / 64)
    assert fp32 - int8 == 2 * 1000 * 2 * 64 * 4 - 2 * 1000 * 2 * 68
    assert pre.bytes_moved(10, 8, 2, 64, 100, 1, 4, 5, kv_elem=1.0625) == (
        2 * 10 * 8 * 64 * 4 + 2 * 100 * 2 * 68 + 4 * 1 * 7 + 4
    )
    assert kv_store.bytes_moved(3, 2, 64, 4, 1.0625) == 2 * 3 * 2 * 64 * 5.0625 + 24


@pytest.mark.parametrize(("device", "dtype"), CASES[:2])
@pytest.mark.parametrize("kind", KINDS)
def test_engine_triton_backend_equals_torch_backend(device, dtype, kind):
    """The whole tiny model over a quantised cache: Triton kernels against the PyTorch
    path, token for token (both quantise the same values the same way)."""
    from dataclasses import replace

    from perfdiag.engine_ref import LLMEngine, SamplingParams
    from perfdiag.engine_ref.testing import tiny_config

    outs = {}
    for backend in ("torch", "triton"):
        cfg = tiny_config()
        cfg = replace(cfg, kernel_backend=backend, dtype=str(dtype).removeprefix("torch."),
                      cache=replace(cfg.cache, kv_dtype=kind))  # fmt: skip
        engine = LLMEngine(cfg)
        params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        outs[backend] = [o.token_ids for o in engine.generate([[256, *range(1, 23)], [256, 9]],
                                                              params)]  # fmt: skip
    assert outs["triton"] == outs["torch"]


@pytest.mark.skipif(not interpreting(), reason="needs TRITON_INTERPRET=1")
def test_emulated_cuda_graphs_on_a_quantised_cache():
    """The CUDA-graph runner's static-buffer path (padding rows with slot −1 and length 0)
    over an int8 cache, emulated on the CPU: the tokens of the eager PyTorch path."""
    from dataclasses import replace

    from perfdiag.engine_ref import LLMEngine
    from perfdiag.engine_ref.cuda_graphs import DecodeGraphs
    from perfdiag.engine_ref.testing import run, tiny_config, workload

    items = workload(n=7, seed=4, max_prompt=20)
    cfg = tiny_config()
    cfg = replace(cfg, cache=replace(cfg.cache, kv_dtype="int8"))
    want = run(LLMEngine(cfg), items, per_step=3).tokens
    engine = LLMEngine(replace(cfg, kernel_backend="triton"))
    graphs = DecodeGraphs(engine.runner, (1, 2, 4), cfg.max_model_len, mode="emulate")
    engine.runner.graphs = graphs.capture()
    got = run(engine, items, per_step=3)
    assert got.tokens == want
    assert graphs.replays > 0 and engine.is_drained()


@pytest.mark.gpu
@pytest.mark.skipif(interpreting() or not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", KINDS)
def test_cuda_graph_replay_on_a_quantised_cache_matches_eager(kind):
    """On CUDA: decode graphs captured over an int8 / fp8 cache replay what the eager
    kernels compute (three decodes padded to a graph of 4: a slot −1 row and a length-0
    one), and a whole run through the graphs drains."""
    from dataclasses import replace

    from perfdiag.engine_ref import LLMEngine
    from perfdiag.engine_ref.request import Request, SamplingParams
    from perfdiag.engine_ref.testing import run, tiny_config, workload

    cfg = tiny_config()
    cache = replace(cfg.cache, kv_dtype=kind)
    cfg = replace(cfg, device="cuda", kernel_backend="triton", cuda_graphs=True,
                  cuda_graph_batch_sizes=(1, 2, 4), cache=cache)  # fmt: skip
    engine = LLMEngine(cfg)
    bm, runner = engine.block_manager, engine.runner
    assert not runner.graphs.failed
    reqs = []
    for i, n in enumerate((5, 9, 3)):
        r = Request(f"r{i}", tuple(range(1, n + 1)), SamplingParams(), 0, n + 2)
        bm.append_slots(r, n)
        r.num_computed_tokens = n - 1
        reqs.append((r, 1))
    inp = runner.prepare(reqs)
    graph_logits = runner.forward(inp)
    assert runner.graphs.replays == 1
    graphs, runner.graphs = runner.graphs, None
    eager = runner.forward(inp)  # stores the same K/V again: the same bytes and scales
    runner.graphs = graphs
    torch.testing.assert_close(graph_logits, eager, atol=1e-3, rtol=1e-3)
    runner.release()
    for r, _ in reqs:
        bm.free(r)
    res = run(engine, workload(n=7, seed=4, max_prompt=20), per_step=3)
    assert engine.is_drained() and all(len(t) > 0 for t in res.tokens.values())
    assert runner.graphs.replays > 1


def test_fp8_on_a_gpu_before_ada_is_refused_in_one_sentence(monkeypatch):
    from perfdiag.engine_ref import kv_quant
    from perfdiag.errors import ConfigError

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (8, 0))
    kv_quant._check_fp8_loads.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"8\.9 or newer \(this one is 8\.0\)"):
            kv_quant._check_fp8_loads(0)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (9, 0))
        kv_quant._check_fp8_loads.cache_clear()
        kv_quant._check_fp8_loads(0)  # Hopper: fine
    finally:
        kv_quant._check_fp8_loads.cache_clear()
