"""A small reader of GGUF files (llama.cpp's format, version 2 and 3): metadata as Python
values, tensors as memory-mapped NumPy views. The `gguf` package's own reader builds a
NumPy view per array element (10 s for a 49k-token vocabulary on a 2-core VM); this one
decodes string arrays in one pass (~0.1 s). Dequantisation stays with `gguf.quants`.

Layout: magic "GGUF", version u32, tensor count u64, key-value count u64; each key-value
a string key, a u32 type and its value (arrays: element type u32, count u64, elements);
each tensor a string name, n_dims u32, dims u64 (innermost first), type u32, offset u64;
tensor data from the next multiple of `general.alignment` (32 by default).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
          6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}  # fmt: skip


class GGUFFormatError(ValueError):
    pass


@dataclass
class Tensor:
    name: str
    qtype: str  # GGMLQuantizationType name: F32, F16, Q4_1, Q8_0, …
    dims: tuple[int, ...]  # innermost first, as GGUF stores them
    data: np.ndarray  # float types: [*reversed dims]; quantised: uint8 [rows, bytes per row]


class GGUFFile:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._buf = np.memmap(self.path, dtype=np.uint8, mode="r")
        self._mv = memoryview(self._buf)
        self._pos = 0
        if bytes(self._mv[0:4]) != b"GGUF":
            raise GGUFFormatError("bad magic (not a GGUF file)")
        self._pos = 4
        version = self._scalar(4)
        if version not in (2, 3):
            raise GGUFFormatError(f"GGUF version {version} unsupported (2, 3)")
        n_tensors, n_kv = self._scalar(10), self._scalar(10)
        self.fields: dict[str, object] = {}
        for _ in range(n_kv):
            key = self._string()
            self.fields[key] = self._value(self._scalar(4))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            dims = tuple(self._scalar(10) for _ in range(self._scalar(4)))
            infos.append((name, dims, self._scalar(4), self._scalar(10)))
        align = int(self.fields.get("general.alignment", 32))
        start = -(-self._pos // align) * align
        self.tensors = [self._tensor(start, *info) for info in infos]

    def _take(self, n: int) -> memoryview:
        if self._pos + n > len(self._mv):
            raise GGUFFormatError("truncated file")
        out = self._mv[self._pos : self._pos + n]
        self._pos += n
        return out

    def _scalar(self, kind: int):
        if kind not in _SCALARS:
            raise GGUFFormatError(f"unknown value type {kind}")
        fmt = _SCALARS[kind]
        return struct.unpack(fmt, self._take(struct.calcsize(fmt)))[0]

    def _string(self) -> str:
        n = self._scalar(10)
        return bytes(self._take(n)).decode("utf-8", errors="replace")

    def _value(self, kind: int):
        if kind == _STRING:
            return self._string()
        if kind != _ARRAY:
            return self._scalar(kind)
        elem, count = self._scalar(4), self._scalar(10)
        if elem == _STRING:
            return [self._string() for _ in range(count)]
        if elem == _ARRAY:
            return [self._value(_ARRAY) for _ in range(count)]
        if elem not in _NUMPY:
            raise GGUFFormatError(f"unknown array element type {elem}")
        dt = np.dtype(_NUMPY[elem]).newbyteorder("<")
        raw = self._take(dt.itemsize * count)
        return np.frombuffer(raw, dtype=dt).tolist()

    def _tensor(self, start: int, name: str, dims, kind: int, offset: int) -> Tensor:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        try:
            qt = GGMLQuantizationType(kind)
        except ValueError:
            raise GGUFFormatError(f"tensor {name}: unknown type {kind}") from None
        block, size = GGML_QUANT_SIZES[qt]
        if not dims or dims[0] % block:
            raise GGUFFormatError(f"tensor {name}: row of {dims[0] if dims else 0} values")
        rows = int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1
        row_bytes = dims[0] // block * size
        begin = start + offset
        if begin + rows * row_bytes > len(self._buf):
            raise GGUFFormatError(f"tensor {name}: data past the end of the file")
        raw = self._buf[begin : begin + rows * row_bytes]
        if qt.name in ("F32", "F16"):
            data = raw.view(np.float32 if qt.name == "F32" else np.float16)
            data = data.reshape(tuple(reversed(dims)))
        else:
            data = raw.reshape(rows, row_bytes)
        return Tensor(name, qt.name, dims, data)
