"""Triton kernels of the reference engine, each beside its PyTorch reference (`ref_*`) and
its cost model (`flops()` / `bytes_moved()`).

| module | kernel |
|---|---|
| `rms_norm` | RMSNorm, optionally fused with the residual add |
| `rope` | rotary embedding of q and k, in place |
| `silu_mul` | SiLU(gate) · up of the fused gate/up projection |
| `kv_store` | new K/V into the paged cache at the slot mapping (negative slots skipped) |
| `decode_attention` | one query token per sequence over paged KV, GQA, split along the sequence |
| `prefill_attention` | flash-style causal attention over paged KV with a cached prefix |
| `backend` | the engine's attention over these kernels, and its per-step metadata |
| `forward` | the decoder's forward pass through the kernels |
| `launch` | the one function every launch goes through (the Triton probe's hook) |

Importing this package does not import triton; the kernel modules do. On the CPU the
kernels run only in Triton's interpreter (`TRITON_INTERPRET=1`, set before they are
imported); see docs/kernels.md.
"""
