"""KV-cache quantisation on this CPU (issue 38): SmolLM2-135M (fp32 weights) with float,
int8 and fp8 KV (`--kv-dtype`): blocks per MiB, ITL at a fixed load, the most concurrent
requests a fixed `--kv-cache-mb` serves without preemption, and the accuracy cost.

- Blocks: engine_ref/kv_cache.py's bytes per block (scales included), exact.
- Capacity: computed, then checked by runs. A request of P prompt + O output tokens holds
  ceil((P + O − 1) / block_size) blocks at its end, so C = (blocks − watermark) // that
  many requests fit at once whatever their phase: a closed loop of C clients must run with
  zero preemptions, and one of 2·C clients shows what the pool does past it (the
  admission reserve queues some requests; others are preempted).
- ITL: per-token ITL p50/p99 and output tokens/s with the float pool's C clients, the
  same load for every dtype (closed loop, fixed lengths, random prompts, no prefix cache).
- Accuracy: engine_ref/kv_quant_accuracy.py against float KV, 3 real prompts, greedy.

Runs `perfdiag run` once per configuration (a fresh process each). Run it alone:

    flock /tmp/perfdiag-cpu.lock .venv/bin/python benchmarks/kv_quant.py [--kv-cache-mb 16]
        [--prompt-len 64] [--output-len 32] [--tokens 32] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DTYPES = ("auto", "int8", "fp8")
BLOCK = 16


def record(out: Path, kv_dtype: str, clients: int, a) -> float:
    cmd = [sys.executable, "-m", "perfdiag", "run", "--preset", "smollm2-135m",
           "--kv-dtype", kv_dtype, "--kv-cache-mb", str(a.kv_cache_mb), "--no-prefix-cache",
           "-w", "chat", "--prompt-len", str(a.prompt_len), "--output-len", str(a.output_len),
           "-n", str(a.per_client * clients + 1), "--warmup", "1", "-c", str(clients),
           "--closed", "--no-device-sampling", "-q", "--out", str(out)]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kv-cache-mb", type=float, default=16.0)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--per-client", type=int, default=3, help="requests per client [3]")
    ap.add_argument("--tokens", type=int, default=32, help="greedy tokens for accuracy [32]")
    ap.add_argument("--skip", default="", help="comma list: runs, accuracy")
    ap.add_argument(
        "--fixed-only",
        action="store_true",
        help="only the fixed-load runs, dtypes interleaved, --rounds times",
    )
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    skip = set(a.skip.split(","))
    out = a.out or Path(tempfile.mkdtemp(prefix="kv-quant-"))

    import torch

    from perfdiag.engine_ref.gguf_loader import preset_file, read_gguf_config
    from perfdiag.engine_ref.kv_cache import bytes_per_block, num_blocks_for_bytes

    path = preset_file("smollm2-135m")
    model = read_gguf_config(path)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}; Python {platform.python_version()}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} torch threads")  # fmt: skip
    print(f"SmolLM2-135M ({model.num_layers} layers, {model.num_kv_heads} KV heads x "
          f"{model.head_dim}), fp32 weights, block size {BLOCK}; runs in {out}")  # fmt: skip

    budget = int(a.kv_cache_mb * 2**20)
    per_req = -(-(a.prompt_len + a.output_len - 1) // BLOCK)
    blocks, capacity = {}, {}
    print(f"\n{'kv dtype':<9}{'bytes/block':>12}{'blocks/MiB':>11}{'x float':>8}"
          f"{f'blocks in {a.kv_cache_mb:g} MiB':>20}{'C (computed)':>13}")  # fmt: skip
    for kv in DTYPES:
        b = bytes_per_block(model, BLOCK, "float32", kv)
        blocks[kv] = n = num_blocks_for_bytes(model, BLOCK, "float32", budget, kv)
        capacity[kv] = (n - int(0.01 * n)) // per_req  # CacheConfig.watermark 0.01
        ratio = bytes_per_block(model, BLOCK, "float32") / b
        print(f"{kv:<9}{b:>12,}{2**20 / b:>11.2f}{ratio:>7.2f}x"
              f"{n:>20}{capacity[kv]:>13}")  # fmt: skip
    bf16 = bytes_per_block(model, BLOCK, "bfloat16")
    print(
        f"(a bfloat16 model's float KV: {bf16:,} bytes/block, {2**20 / bf16:.2f} blocks/MiB; "
        f"int8 holds {bf16 / bytes_per_block(model, BLOCK, 'float32', 'int8'):.2f}x that)"
    )
    print(f"a request: {a.prompt_len} prompt + {a.output_len} output tokens = {per_req} blocks")

    if "runs" not in skip:
        runs(a, out, capacity)
    if "accuracy" not in skip:
        accuracy(path, model, a.tokens)


def runs(a, out: Path, capacity: dict) -> None:
    from perfdiag import load_run
    from perfdiag.analyzers.serving import analyze_serving

    fixed = capacity["auto"]
    plan = []  # (label, kv dtype, clients)
    if a.fixed_only:  # interleaved: the machine's drift falls on every dtype alike
        for r in range(a.rounds):
            plan += [(f"{kv} c={fixed} #{r + 1}", kv, fixed) for kv in DTYPES]
    for kv in DTYPES if not a.fixed_only else ():
        for clients in sorted({fixed, capacity[kv], 2 * capacity[kv]}):
            plan.append((f"{kv} c={clients}", kv, clients))
    print(
        f"\n{'run':<17}{'clients':>8}{'preempt':>8}{'peak run':>9}{'mean run':>9}"
        f"{'ITL p50 ms':>11}{'ITL p99 ms':>11}{'TTFT p50 s':>11}{'tok/s':>7}{'wall s':>7}"
    )
    for label, kv, clients in plan:
        path = out / label.replace(" ", "_").replace("=", "").replace("#", "r")
        wall = record(path, kv, clients, a)
        run = load_run(path)
        m = analyze_serving(run).metrics
        s = run.steps
        itl = m.itl_per_token_s
        print(f"{label:<17}{clients:>8}{int(s['num_preempted'].fillna(0).sum()):>8}"
              f"{int(s['num_running'].max()):>9}{s['num_running'].mean():>9.1f}"
              f"{itl.p50 * 1e3:>11.1f}{itl.p99 * 1e3:>11.1f}{m.ttft_s.p50:>11.2f}"
              f"{m.throughput.output_tokens_per_s:>7.1f}{wall:>7.0f}", flush=True)  # fmt: skip


def accuracy(path, model, tokens: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from dataclasses import replace

    from smollm2_model import PROMPTS

    from perfdiag.engine_ref import EngineConfig, LLMEngine
    from perfdiag.engine_ref.kv_quant_accuracy import compare, greedy

    cfg = EngineConfig(model=model, model_path=str(path), max_model_len=512)
    engine = LLMEngine(cfg)
    base = greedy(engine, [engine.tokenizer.encode(p) for p in PROMPTS], tokens)
    print(
        f"\naccuracy against float KV: {len(PROMPTS)} prompts x {tokens} greedy tokens; "
        f"teacher-forced |Δ logprob| and top-1 over float's tokens"
    )
    print(f"{'kv dtype':<9}{'prompt':>7}{'max |Δlp|':>10}{'mean |Δlp|':>11}{'top-1':>7}"
          f"{'same tokens':>12}{'first diff':>11}")  # fmt: skip
    for kv in DTYPES[1:]:
        rows = compare(LLMEngine(replace(cfg, cache=replace(cfg.cache, kv_dtype=kv))), base)
        for i, r in enumerate(rows):
            first = "-" if r.first_divergence is None else str(r.first_divergence)
            print(f"{kv:<9}{i:>7}{r.max_abs_dlogprob:>10.4f}{r.mean_abs_dlogprob:>11.4f}"
                  f"{r.top1_agree:>7.3f}{r.agree:>12.3f}{first:>11}")  # fmt: skip
        n = len(rows)
        print(
            f"{kv:<9}{'all':>7}{max(r.max_abs_dlogprob for r in rows):>10.4f}"
            f"{sum(r.mean_abs_dlogprob for r in rows) / n:>11.4f}"
            f"{sum(r.top1_agree for r in rows) / n:>7.3f}{sum(r.agree for r in rows) / n:>12.3f}"
        )


if __name__ == "__main__":
    main()
