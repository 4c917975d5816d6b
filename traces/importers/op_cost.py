"""FLOPs and bytes of the operators a profiler recorded with their shapes
(`record_shapes`), for the op-level roofline: the GEMMs (aten::mm, addmm, bmm, baddbmm)
and the attention leaf ops, counted as torch's flop counter counts them (two FLOPs per
multiply-add; attention's two batched GEMMs, not halved for a causal mask) and with the
least traffic a roofline assumes (each input read once, the output written once).

Only leaf ops get figures: aten::linear and aten::matmul contain an aten::mm, and
counting both would count the work twice. A CPU build of torch writes no `flops` into
its trace even with `with_flops`, which is why the shapes are read here.
"""

from __future__ import annotations

import math
import re

ITEMSIZE = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1, "int": 4, "long int": 8, "short int": 2, "signed char": 1,
    "unsigned char": 1, "bool": 1,
}  # fmt: skip
_ATTENTION = re.compile(r"aten::_scaled_dot_product_\w*attention\w*|aten::_flash_attention_\w+")


def op_cost(name: str, args: dict) -> tuple[int | None, int | None]:
    """(flops, bytes) of one op from its args' "Input Dims" and "Input type", or Nones
    when the op is not one counted here or its shapes do not fit it."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list):
        return None, None
    try:
        return _cost(name, dims, types)
    except (TypeError, ValueError, IndexError, KeyError):
        return None, None  # shapes of another form than this op's: no figure, not a guess


def _cost(name: str, dims: list, types: list) -> tuple[int | None, int | None]:
    size = ITEMSIZE[types[0]] if name != "aten::addmm" else ITEMSIZE[types[1]]
    if name == "aten::mm":
        (m, k), (k2, n) = dims[0], dims[1]
        return _gemm(1, m, k, n, k2, size, bias=0)
    if name == "aten::addmm":
        (m, k), (k2, n) = dims[1], dims[2]
        return _gemm(1, m, k, n, k2, size, bias=_numel(dims[0]))
    if name == "aten::bmm":
        (b, m, k), (b2, k2, n) = dims[0], dims[1]
        return _gemm(b, m, k, n, k2, size, bias=0, b2=b2)
    if name == "aten::baddbmm":
        (b, m, k), (b2, k2, n) = dims[1], dims[2]
        return _gemm(b, m, k, n, k2, size, bias=_numel(dims[0]), b2=b2)
    if _ATTENTION.fullmatch(name):
        q, k, v = dims[0], dims[1], dims[2]
        if not (len(q) == len(k) == len(v) == 4):
            return None, None
        batch, heads, lq, d = q
        lk, dv = k[2], v[3]
        flops = 2 * batch * heads * lq * lk * (d + dv)
        out = batch * heads * lq * dv
        return int(flops), int((_numel(q) + _numel(k) + _numel(v) + out) * size)
    return None, None


def _gemm(b, m, k, n, k2, size, bias, b2=None):
    if k != k2 or (b2 is not None and b2 != b):
        return None, None
    flops = 2 * b * m * k * n
    return int(flops), int((b * (m * k + k * n + m * n) + bias) * size)


def _numel(shape) -> int:
    return math.prod(int(x) for x in shape) if shape else 1
