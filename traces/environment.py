"""The environment fingerprint stored in every manifest, and the clock origin.

A run must say what produced it (triage step 1: pin versions before comparing). Versions
come from package metadata, so fingerprinting never imports torch or triton itself;
device details are read from torch only when the caller already loaded it (or asks
for `deep=True`, as `perfdiag doctor` does).
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from .._version import __version__


def machine_cores() -> int:
    """The cores this process may run on (its affinity where the OS says; else all)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


PACKAGES = (
    "torch",
    "triton",
    "numpy",
    "pandas",
    "pyarrow",
    "perfetto",
    "textual",
    "typer",
    "rich",
    "nvidia-ml-py",
    "psutil",
    "pyyaml",
    "transformers",
)


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_revision(path: Path | None = None) -> str | None:
    """The source tree's commit, with `-dirty` when it has uncommitted changes."""
    here = path or Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{rev}-dirty" if dirty else rev


def torch_devices() -> dict:
    """CUDA facts from torch; only call where importing torch is acceptable."""
    import torch

    info: dict = {
        "cuda_runtime": torch.version.cuda,
        "hip_runtime": getattr(torch.version, "hip", None),
        "cuda_available": torch.cuda.is_available(),
        "gpus": [],
    }
    if info["cuda_available"]:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            info["gpus"].append(
                {
                    "index": i,
                    "name": p.name,
                    "memory_bytes": p.total_memory,
                    "sm_count": p.multi_processor_count,
                    "capability": f"{p.major}.{p.minor}",
                }
            )
    return info


def nvml_driver() -> dict:
    """Driver facts through NVML; an absent library or GPU is an answer, not an error."""
    try:
        import pynvml
    except ImportError:
        return {"nvml": "nvidia-ml-py not installed"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:  # NVMLError_LibraryNotFound without a driver
        return {"nvml": f"unavailable ({e})"}
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        return {
            "nvml": "ok",
            "driver": driver.decode() if isinstance(driver, bytes) else driver,
            "nvml_gpu_count": pynvml.nvmlDeviceGetCount(),
        }
    finally:
        pynvml.nvmlShutdown()


def fingerprint(*, deep: bool = False) -> dict:
    """What a reproduction needs to know about this machine and its software."""
    env: dict = {
        "perfdiag": __version__,
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "git_revision": git_revision(),
        "packages": {name: package_version(name) for name in PACKAGES},
    }
    if deep or "torch" in sys.modules:
        env.update(torch_devices())
    if deep or "pynvml" in sys.modules:
        env.update(nvml_driver())
    return env


def clock_origin(samples: int = 5) -> dict:
    """Pair the monotonic clock with wall time, taking the tightest of a few readings.

    `wall_ns = monotonic_ns - origin.monotonic_ns + origin.wall_ns`; `uncertainty_ns`
    bounds the error of that mapping.
    """
    best = None
    for _ in range(samples):
        m0 = time.monotonic_ns()
        w = time.time_ns()
        m1 = time.monotonic_ns()
        if best is None or m1 - m0 < best[2]:
            best = ((m0 + m1) // 2, w, m1 - m0)
    mono, wall, width = best
    return {
        "clock": "monotonic",
        "monotonic_ns": mono,
        "wall_ns": wall,
        "uncertainty_ns": width,
        "resolution_ns": int(time.get_clock_info("monotonic").resolution * 1e9) or 1,
    }
