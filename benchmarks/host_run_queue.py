"""Does the stepping thread's run-queue wait measure the step time a neighbour takes?

    flock /tmp/perfdiag-cpu.lock .venv/bin/python benchmarks/host_run_queue.py [--preset P]
        [--clients N] [--requests R] [--out DIR]

Records the same closed loop (the same requests, so the same steps) alone, beside 0.5,
1.0 and 1.5 burning cores per core (probes/faults.py `burning`), and alone again, and
prints per run: Σ step wall time, Σ run-queue wait of the stepping thread (steps'
`run_delay_ns`), their difference (constant when the wait is the whole loss), the CPU the
process got, CPU per second the stepping thread was not waiting (above
analyzers/host.py's SINGLE_THREAD_CORES the wait is not used), the step time lost against
the mean of the two alone runs (the truth here), and host-contention's lost share as the
analysis gives it (`measured` where the wait decides, else the inference).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.diagnosis.scenarios import HEALTHY, Scenario, _closed, _len
from perfdiag import load_run
from perfdiag.analyzers.host import SINGLE_THREAD_CORES
from perfdiag.analyzers.serving import analyze_serving

LOADS = (0.0, 0.5, 1.0, 1.5, 0.0)  # burning cores per core; alone first and last


def record(root: Path, preset: str, clients: int, requests: int, load: float, i: int) -> Path:
    name = f"{preset}-c{clients}-b{load:g}-{i}"
    scenario = Scenario(
        name, "benchmark", HEALTHY, engine=dict(preset=preset, max_seqs=max(8, clients)),
        workload=dict(requests=requests, warmup=4, arrival=_closed(clients), seed=5,
                      prompt_len=_len("uniform:16:64"), output_len=_len("uniform:16:32")),
        neighbours=load, probes={"device_sampling": True},
    )  # fmt: skip
    return scenario.record(root / name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks/host_run_queue.py")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    root = a.out or Path(tempfile.mkdtemp(prefix="host-run-queue-"))
    rows = []
    for i, load in enumerate(LOADS):
        run = load_run(record(root, a.preset, a.clients, a.requests, load, i))
        st = run.steps
        wall = (st["end_ns"] - st["start_ns"]).to_numpy(float).sum() / 1e9
        wait = np.nansum(st["run_delay_ns"].to_numpy(float, na_value=np.nan)) / 1e9
        cpu = np.nansum(st["cpu_time_ns"].to_numpy(float, na_value=np.nan)) / 1e9
        host = analyze_serving(run).host
        rows.append((load, wall, wait, cpu, host))
    alone = (rows[0][1] + rows[-1][1]) / 2
    print(f"{a.preset}, closed loop of {a.clients}, {a.requests} requests; "
          f"SINGLE_THREAD_CORES {SINGLE_THREAD_CORES}")  # fmt: skip
    print(
        "burn/core  steps s   wait s  wall-wait s   cpu s  cpu/running  lost (truth)  "
        "host-contention (path)"
    )
    for load, wall, wait, cpu, host in rows:
        per_running = cpu / (wall - wait) if wall > wait else float("nan")
        path = "measured" if np.isfinite(host.run_queue_share) else "inferred"
        print(
            f"{load:9.1f} {wall:8.2f} {wait:8.2f} {wall - wait:12.2f} {cpu:7.2f} "
            f"{per_running:12.2f} {1 - alone / wall:13.2f}  {host.lost_share:.2f} ({path})"
        )
    print(f"runs kept in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
