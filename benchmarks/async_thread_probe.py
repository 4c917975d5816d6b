"""Does Python host work on a second thread overlap a torch forward on this CPU? (issue 39:
why engine_ref's overlapped scheduling runs its look-ahead in line on the CPU.)

A decode batch of 8 is prepared once and its forward timed alone; then the forward
followed by host work of half its time (Python spinning, holding the GIL as the scheduler
does), and the same with the host work on a thread started beside the forward. Best of 5
× 30; with torch's threads as configured and with 1 (a core left to the host thread).

    flock /tmp/perfdiag-cpu.lock .venv/bin/python benchmarks/async_thread_probe.py PRESET
"""

from __future__ import annotations

import sys
import threading
import time

import torch

from perfdiag.engine_ref import LLMEngine, SamplingParams
from perfdiag.probes.run_options import EngineOptions


def spin(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass  # Python holding the GIL, as the scheduler does


def best_ms(fn, n: int = 30) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e3


def main() -> None:
    preset = sys.argv[1] if len(sys.argv) > 1 else "small"
    eng = LLMEngine(EngineOptions(preset=preset).engine_config())
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)
    for i in range(8):
        eng.add_request(list(range(1, 40)), params, request_id=f"r{i}")
    for _ in range(3):
        eng.step()  # the prefills: what follows is a decode batch
    inp = eng.runner.prepare(eng.scheduler.schedule(time.monotonic_ns()).scheduled)

    def forward() -> None:
        eng.runner.forward(inp)  # the same slots each time: the batch's own

    for threads in (torch.get_num_threads(), 1):
        torch.set_num_threads(threads)
        fwd = best_ms(forward)
        host = fwd * 0.5
        in_line = best_ms(lambda h=host: (forward(), spin(h)))

        def beside(h: float = host) -> None:
            th = threading.Thread(target=spin, args=(h,))
            th.start()
            forward()
            th.join()

        threaded = best_ms(beside)
        hidden = in_line - threaded
        print(f"{preset}, torch threads {threads}: forward {fwd:.2f} ms, host {host:.2f} ms; "
              f"in line {in_line:.2f} ms, host on a thread {threaded:.2f} ms: hidden "
              f"{hidden:.2f} ms ({hidden / host:.0%} of the host work)")  # fmt: skip


if __name__ == "__main__":
    main()
