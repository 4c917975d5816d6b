"""perfdiag against a real vLLM (the CPU build, SmolLM2-135M), one everyday fault at a time:
launch, drive, analyze, and verify the top advice by relaunching with it (issue 34).

For each case it prints the top finding (and whether it is the expected one), TTFT p50 and
E2E p50 of the faulty run, and, where the advice names a vLLM flag, the relaunched run's
figures and the verdict of `perfdiag analyze --verify-advice`; then the TTFT split's
agreement (the client's TTFT against the server's own, same requests). `--repeats N`
records each case N times (verification included) so run-to-run noise shows.

    make vllm && .venv/bin/python benchmarks/vllm_diagnosis.py [--cases seq-cap,light]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Case:
    name: str
    server_args: str  # vLLM flags beyond the common ones
    workload: tuple[str, ...]  # perfdiag run's workload flags
    expect: str | None  # the check named first; None: nothing critical
    max_model_len: int = 2048


SPEC_NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
              "prompt_lookup_min": 1}  # fmt: skip

CASES = (
    Case("seq-cap", "--max-num-seqs 2",
         ("-n", "48", "--warmup", "4", "-c", "16", "--closed", "--prompt-len", "64",
          "--output-len", "32"), "server-seq-cap"),
    Case("kv-pressure", "--num-gpu-blocks-override 12",
         ("-n", "32", "--warmup", "4", "-c", "8", "--closed", "--prompt-len", "64",
          "--output-len", "320"), "server-kv-pressure", max_model_len=1024),
    Case("budget-sliced", "--max-num-seqs 16 --max-num-batched-tokens 32",
         ("-n", "16", "--warmup", "2", "-c", "8", "--closed", "--prompt-len", "1024",
          "--output-len", "32"), "server-prefill-sliced"),
    Case("prefix-off", "--no-enable-prefix-caching",
         ("-n", "24", "--warmup", "4", "-c", "4", "--closed", "--shared-prefix", "4:512",
          "--prompt-len", "128", "--output-len", "32"), "prefix-not-reused"),
    Case("light", "",
         ("-n", "16", "--warmup", "2", "--rate", "1", "--prompt-len", "64",
          "--output-len", "32"), None),
    # n-gram speculation (issue 38): greedy SmolLM2 loops on random-id prompts, so prompt
    # lookup drafts are mostly accepted; the run's spec-acceptance comes from vLLM's
    # spec_decode counters and nothing critical fires.
    Case("spec-ngram", f"--speculative-config '{json.dumps(SPEC_NGRAM)}'",
         ("-n", "12", "--warmup", "2", "-c", "4", "--closed", "--prompt-len", "64",
          "--output-len", "128"), None),
)  # fmt: skip


def model_dir(venv: Path) -> str:
    out = subprocess.run([str(venv / "bin" / "python"), str(ROOT / "scripts" / "vllm_model.py")],
                         capture_output=True, text=True, check=True)  # fmt: skip
    return out.stdout.strip().splitlines()[-1]


def launch_command(venv: Path, case: Case, model: str) -> str:
    """The CPU build's KV space (GiB) and thread binding in its environment; eager mode
    (no torch.compile: ~20-40 s to start instead of ~4 min on 2 cores)."""
    return (f"VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=auto {venv / 'bin' / 'vllm'} "
            f"serve {model} --served-model-name smollm2 --enforce-eager --dtype bfloat16 "
            f"--max-model-len {case.max_model_len} {case.server_args}").strip()  # fmt: skip


def perfdiag(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "perfdiag", *args], capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def record(venv: Path, case: Case, model: str, out: Path) -> None:
    done = perfdiag("run", "--launch", launch_command(venv, case, model), "-q", "-o", str(out),
                    *case.workload)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{case.name}: perfdiag run failed: {done.stderr.strip()[-500:]}")


def p50s(run: Path) -> tuple[float, float]:
    if not (run / "results" / "metrics.json").exists():  # a relaunch --verify-advice made
        perfdiag("analyze", str(run))
    metrics = json.loads((run / "results" / "metrics.json").read_text())["metrics"]
    return metrics["ttft_s"]["p50"], metrics["e2e_s"]["p50"]


def one(venv: Path, case: Case, model: str, out: Path) -> dict:
    record(venv, case, model, out)
    verify = case.expect is not None
    args = ["analyze", str(out), *(["--verify-advice"] if verify else [])]
    done = perfdiag(*args)
    if done.returncode != 0:
        raise RuntimeError(f"{case.name}: perfdiag analyze failed: {done.stderr.strip()[-500:]}")
    findings = json.loads((out / "results" / "findings.json").read_text())
    top = findings.get("top")
    critical = [f["check"] for f in findings["findings"] if f["severity"] == "critical"]
    split = next((f for f in findings["findings"] if f["check"] == "server-queue-dominates-ttft"),
                 None)  # fmt: skip
    row = {"case": case.name, "top": top, "critical": critical, "p50": p50s(out),
           "ok": top == case.expect if verify else not critical}  # fmt: skip
    if split is not None:
        ev = {e["name"]: e["value"] for e in split["evidence"]}
        row["outside_pct"] = ev["outside_ms"] / ev["ttft_ms"]
    spec = next((f for f in findings["findings"] if f["check"] == "spec-acceptance"), None)
    if spec is not None:  # read from vLLM's spec_decode counters
        row["spec"] = spec["title"]
    v_path = out / "results" / "verification.json"
    if verify and v_path.exists():
        v = json.loads(v_path.read_text())
        row["verdict"] = v["verdict"]
        row["flags"] = " ".join(
            f"{s['option'].split('.', 1)[1]}={s['to']}" for s in v["action"]["settings"]
        )
        if v.get("run_b"):
            row["fixed_p50"] = p50s(Path(v["run_b"]))
    return row


LOCK = Path("/tmp/perfdiag-vllm.lock")  # one vLLM measurement at a time on this machine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--venv", type=Path, default=ROOT / ".venv-vllm")
    p.add_argument("--cases", default=",".join(c.name for c in CASES))
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out", type=Path, default=ROOT / "build" / "vllm-diagnosis")
    a = p.parse_args()
    wanted = a.cases.split(",")
    model = model_dir(a.venv)
    lock = open(LOCK, "w")  # noqa: SIM115 (held until the process ends)
    fcntl.flock(lock, fcntl.LOCK_EX)  # others' vLLM runs would skew the timings
    stamp = time.strftime("%Y%m%dT%H%M%S")
    print(f"perfdiag vs vLLM (CPU build) — {stamp}, {len(wanted)} cases × {a.repeats}")
    print(f"{'case':14} {'top finding':28} ok  TTFT p50 / E2E p50 (s)   fix → TTFT / E2E (s)"
          "     verdict    flags               outside")  # fmt: skip
    rows = []
    for r in range(a.repeats):
        for case in (c for c in CASES if c.name in wanted):
            row = one(a.venv, case, model, a.out / stamp / f"{case.name}-{r}")
            rows.append(row)
            ttft, e2e = row["p50"]
            fixed = row.get("fixed_p50")
            fix = f"{fixed[0]:7.2f} / {fixed[1]:6.2f}" if fixed else f"{'—':>16}"
            outside = row.get("outside_pct")
            print(f"{case.name:14} {row['top'] or 'none':28} {'yes' if row['ok'] else 'NO ':3} "
                  f"{ttft:8.2f} / {e2e:6.2f}        {fix}    {row.get('verdict', '—'):10} "
                  f"{row.get('flags', '—'):19} "
                  f"{f'{outside:+.1%}' if outside is not None else '—'}", flush=True)  # fmt: skip
            if "spec" in row:
                print(f"{'':14} {row['spec']}", flush=True)
    named = sum(r["ok"] for r in rows)
    improved = sum(r.get("verdict") == "improved" for r in rows)
    verified = sum("verdict" in r for r in rows)
    print(f"named right (or nothing critical): {named}/{len(rows)}; advice improved its target "
          f"beyond the run's noise: {improved}/{verified}")  # fmt: skip


if __name__ == "__main__":
    main()
