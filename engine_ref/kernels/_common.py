"""Small helpers shared by the kernel modules."""

from __future__ import annotations

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction

from ...errors import ConfigError


@triton.jit
def _decorated_here(x):  # tells whether @triton.jit produced interpreted functions
    pass


def interpreting() -> bool:
    """True when the kernels were decorated under TRITON_INTERPRET=1 (they run on the CPU,
    in NumPy); decided once, when the kernel modules were imported."""
    return isinstance(_decorated_here, InterpretedFunction)


def check_device(device: torch.device | str) -> None:
    """The kernels run on CUDA compiled, or on the CPU interpreted: refuse the other pairs
    with a sentence instead of a driver traceback."""
    kind = torch.device(device).type
    if kind == "cpu" and not interpreting():
        raise ConfigError(
            "the triton kernel backend on the CPU needs Triton's interpreter: set "
            "TRITON_INTERPRET=1 before perfdiag imports its kernels (perfdiag run does this)"
        )
    if kind == "cuda" and interpreting():
        raise ConfigError("TRITON_INTERPRET=1 is set: unset it to run the kernels on CUDA")
    if kind not in ("cpu", "cuda"):
        raise ConfigError(f"the triton kernel backend does not run on {kind}")


def pow2(n: int, at_least: int = 1) -> int:
    return max(at_least, triton.next_power_of_2(max(1, int(n))))


def elem_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 dots in full precision (Triton's default on GPUs is TF32, 10-bit mantissas),
    so fp32 engines stay token for token with the PyTorch path."""
    return "ieee" if dtype == torch.float32 else "tf32"
