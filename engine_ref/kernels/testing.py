"""Cases and inputs shared by the kernel tests and micro-benchmarks (not needed to serve).

Kernels are checked against their `ref_*` on the CPU in Triton's interpreter (fp32, fp16:
its bf16 arithmetic is wrong) and, on a GPU machine, compiled on CUDA (bf16 too; those
cases carry the `gpu` mark). Paged inputs scatter each sequence's blocks at random over
the pool, as a long-running cache does.
"""

from __future__ import annotations

import torch

from ._common import interpreting

# max |kernel − reference| ≤ atol + rtol·|reference|, per dtype
TOLERANCES = {
    torch.float32: dict(atol=2e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


def device_cases() -> list:
    """(device, dtype) parameters: the interpreter's on the CPU, compiled ones on CUDA."""
    import pytest

    cpu_skip = pytest.mark.skipif(not interpreting(), reason="needs TRITON_INTERPRET=1")
    no_gpu = interpreting() or not torch.cuda.is_available()
    gpu = [pytest.mark.gpu, pytest.mark.skipif(no_gpu, reason="needs CUDA, not interpreted")]
    return [
        pytest.param("cpu", torch.float32, marks=cpu_skip, id="cpu-fp32"),
        pytest.param("cpu", torch.float16, marks=cpu_skip, id="cpu-fp16"),
        pytest.param("cuda", torch.float32, marks=gpu, id="cuda-fp32"),
        pytest.param("cuda", torch.float16, marks=gpu, id="cuda-fp16"),
        pytest.param("cuda", torch.bfloat16, marks=gpu, id="cuda-bf16"),
    ]


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.float(), want.float(), **TOLERANCES[want.dtype])


def paged_cache(num_blocks, block_size, kv_heads, head_dim, dtype, device, seed=0):
    """Random K and V caches [blocks, block_size, kv_heads, head_dim]: halves of one
    tensor, as the engine's layer caches are."""
    g = torch.Generator(device).manual_seed(seed)  # drawn where it lives: GiBs for benchmarks
    shape = (2, num_blocks, block_size, kv_heads, head_dim)
    kv = torch.randn(shape, generator=g, device=device).to(dtype)
    return kv[0], kv[1]


def scattered_tables(context_lens, block_size, num_blocks, width=None, seed=0):
    """int32 [S, width] block tables, every sequence's blocks distinct and scattered over
    the pool (padding columns hold other blocks: a kernel that reads past a length reads
    garbage, never zeros)."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in context_lens]
    width = width or max(max(need), 1)
    perm = torch.randperm(num_blocks, generator=g)
    assert sum(need) <= num_blocks and width <= num_blocks
    rows, at = [], 0
    for n in need:
        own = perm[at : at + n].tolist()
        at += n
        pad = torch.randint(0, num_blocks, (width - n,), generator=g).tolist()
        rows.append(own + pad)
    return torch.tensor(rows, dtype=torch.int32)
