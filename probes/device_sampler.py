"""A sampler thread: host CPU and memory (psutil) always, GPUs (NVML) when present.

Counters written (name, scope):
  cpu_util_pct (cpuN)            per logical core, since the previous sample
  cpu_steal_pct (host)           time the hypervisor gave the machine's cores to others
  procs_running (host)           runnable threads on the machine now (Linux /proc/stat)
  process_cpu_pct, process_rss_bytes (process)   CPU: the engine's tensor-parallel workers too
  gpu_util_pct, gpu_mem_util_pct, gpu_mem_used_bytes, sm_clock_mhz, power_w,
  pcie_tx_bytes_per_s, pcie_rx_bytes_per_s (gpuN)
NVML's "GPU utilisation" is the fraction of time any kernel ran, not compute utilisation
(DOMAIN.md §3): the roofline answers that question, not this counter.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

import psutil

from ..errors import ConfigError

MIN_PERIOD_S = 0.01


class DeviceSampler:
    def __init__(self, append: Callable[[tuple], None], period_s: float = 0.2,
                 gpus: bool = True, worker_pids: tuple[int, ...] = ()):  # fmt: skip
        if period_s < MIN_PERIOD_S:
            raise ConfigError(f"sampling period must be >= {MIN_PERIOD_S} s, got {period_s}")
        self._append = append
        self.period_s = period_s
        self._process = psutil.Process()
        # Tensor-parallel workers are the engine too: their CPU counts as the process's.
        self._workers = [psutil.Process(pid) for pid in worker_pids]
        self._nvml = _Nvml() if gpus else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="perfdiag-sampler", daemon=True)
        self.samples = 0

    @property
    def gpu_count(self) -> int:
        return self._nvml.count if self._nvml else 0

    def start(self) -> DeviceSampler:
        # Prime the "since last call" counters so the first sample is meaningful.
        psutil.cpu_percent(percpu=True)
        psutil.cpu_times_percent()
        self._process.cpu_percent()
        for w in self._workers:
            w.cpu_percent()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.sample()  # the last interval too
        if self._nvml:
            self._nvml.close()

    def _loop(self) -> None:
        next_due = time.monotonic() + self.period_s
        while not self._stop.wait(max(0.0, next_due - time.monotonic())):
            self.sample()
            next_due += self.period_s  # an absolute cadence: no drift

    def sample(self) -> None:
        ts = time.monotonic_ns()
        add = self._append
        for core, pct in enumerate(psutil.cpu_percent(percpu=True)):
            add(("cpu_util_pct", ts, float(pct), f"cpu{core}"))
        steal = getattr(psutil.cpu_times_percent(), "steal", None)
        if steal is not None:
            add(("cpu_steal_pct", ts, float(steal), "host"))
        running = _procs_running()
        if running is not None:
            add(("procs_running", ts, float(running), "host"))
        with self._process.oneshot():
            cpu = self._process.cpu_percent()
            for w in self._workers:
                with contextlib.suppress(psutil.Error):
                    cpu += w.cpu_percent()
            add(("process_cpu_pct", ts, float(cpu), "process"))
            add(("process_rss_bytes", ts, float(self._process.memory_info().rss), "process"))
        if self._nvml:
            for name, value, scope in self._nvml.sample():
                add((name, ts, value, scope))
        self.samples += 1


def _procs_running() -> int | None:
    """Threads runnable on the machine right now (ours included); None off Linux."""
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"procs_running "):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class _Nvml:
    """NVML when a driver is present; otherwise zero GPUs, no error (a CPU machine)."""

    def __init__(self) -> None:
        self.handles: list = []
        self.count = 0
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:  # NVMLError_LibraryNotFound without a driver, ImportError
            self._pynvml = None
            return
        self._pynvml = pynvml
        self.count = pynvml.nvmlDeviceGetCount()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(self.count)]

    def sample(self) -> list[tuple[str, float, str]]:
        nv, out = self._pynvml, []
        for i, h in enumerate(self.handles):
            scope = f"gpu{i}"
            readers = {
                "gpu_util_pct": lambda h=h: nv.nvmlDeviceGetUtilizationRates(h).gpu,
                "gpu_mem_util_pct": lambda h=h: nv.nvmlDeviceGetUtilizationRates(h).memory,
                "gpu_mem_used_bytes": lambda h=h: nv.nvmlDeviceGetMemoryInfo(h).used,
                "sm_clock_mhz": lambda h=h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
                "power_w": lambda h=h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                # NVML reports PCIe throughput in KB/s over a 20 ms window.
                "pcie_tx_bytes_per_s": lambda h=h: (
                    nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES) * 1024.0
                ),
                "pcie_rx_bytes_per_s": lambda h=h: (
                    nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES) * 1024.0
                ),
            }
            for name, read in readers.items():
                with contextlib.suppress(nv.NVMLError):  # a counter this GPU lacks
                    out.append((name, float(read()), scope))
        return out

    def close(self) -> None:
        if self._pynvml is not None:
            with contextlib.suppress(self._pynvml.NVMLError):
                self._pynvml.nvmlShutdown()
