"""The real model on the CPU (issue 20): engine_ref's batch-1 decode of SmolLM2-135M
against its memory-bandwidth floor; float vs q4_1 decode and prefill with their roofline
positions; transformers' generate and llama.cpp (llama-cpp-python) on the same GGUF file.
engine_ref float runs twice: on its default PyTorch kernels and with `kernel_backend="numba"`
(decode steps' small ops fused by Numba: engine_ref/cpu_kernels.py).

    .venv/bin/python benchmarks/cpu_decode.py [--tokens 64] [--prefill 512] [--rounds 2]

Decode per token = (time of a request with 1 + N output tokens − time with 1) / N, best of
the rounds (a co-tenant only ever slows a round). The floor is the bytes a decode step
must read (weights as stored + the KV it attends over) over the measured copy bandwidth.
Roofline positions use analyzers/model_flops.py's cost model (ideal traffic) and the
measured ceilings: copy bandwidth, and a large fp32 GEMM's FLOP/s.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from perfdiag.analyzers.model_flops import ModelShape, StepShape, for_weight_format, step_totals
from perfdiag.engine_ref import CacheConfig, EngineConfig, LLMEngine, SamplingParams
from perfdiag.engine_ref.gguf_loader import preset_file, read_gguf_config

TEXT = (
    "The history of science is the study of the development of science and scientific "
    "knowledge, including both the natural and social sciences. Science is a body of "
    "empirical, theoretical, and practical knowledge about the natural world, produced by "
    "scientists who emphasize the observation, explanation, and prediction of real-world "
    "phenomena. "
)


def best(fn, rounds: int) -> float:
    out = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        out = min(out, time.perf_counter() - t)
    return out


def copy_bandwidth(nbytes: int = 1 << 30, reps: int = 5) -> float:
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    return 2 * nbytes / best(lambda: dst.copy_(src), reps)


def read_bandwidth(nbytes: int = 1 << 30, reps: int = 5) -> float:
    """Bytes read per second by one vectorised pass (a sum): what a GEMV's weights need."""
    src = torch.ones(nbytes // 4)
    src.sum()
    return nbytes / best(lambda: src.sum(), reps)


def gemm_flops(n: int = 2048, reps: int = 3) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    return 2 * n**3 / best(lambda: a @ b, reps)


def engine_times(engine, prompt_ids, long_ids, tokens, rounds):
    """(decode s/token, prefill s for long_ids)."""

    def gen(ids, n):
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        engine.generate([ids], params)

    gen(prompt_ids, 4)  # warm-up
    one = best(lambda: gen(prompt_ids, 1), rounds + 1)
    many = best(lambda: gen(prompt_ids, 1 + tokens), rounds)
    prefill = best(lambda: gen(long_ids, 1), rounds)
    return (many - one) / tokens, prefill


def hf_times(path, prompt_ids, long_ids, tokens, rounds):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()

    def gen(ids, n):
        with torch.no_grad():
            model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False)  # fmt: skip

    gen(prompt_ids, 4)
    one = best(lambda: gen(prompt_ids, 1), rounds + 1)
    many = best(lambda: gen(prompt_ids, 1 + tokens), rounds)
    prefill = best(lambda: gen(long_ids, 1), rounds)
    return (many - one) / tokens, prefill


def llama_cpp_times(path, prompt_ids, long_ids, tokens, rounds):
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=2048, n_batch=512, n_threads=torch.get_num_threads(),
                verbose=False)  # fmt: skip

    def decode():
        llm.reset()
        llm.eval(prompt_ids)
        t = time.perf_counter()
        for i in range(tokens):
            llm.eval([prompt_ids[i % len(prompt_ids)]])  # the cost does not depend on the id
        return (time.perf_counter() - t) / tokens

    def prefill():
        llm.reset()
        llm.eval(long_ids)

    decode()
    per_token = min(decode() for _ in range(rounds))
    return per_token, best(prefill, rounds)


def position(model: ModelShape, shape: StepShape, seconds: float, bw: float, peak: float):
    flops, nbytes = (float(v) for v in step_totals(model, shape))
    rate, fps = nbytes / seconds, flops / seconds
    return (f"{nbytes / 1e6:7.1f} MB, {flops / 1e9:6.2f} GFLOP -> {rate / 1e9:5.2f} GB/s "
            f"({rate / bw:4.0%} of copy bw), {fps / 1e9:6.1f} GFLOP/s "
            f"({fps / peak:4.0%} of GEMM peak)")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--skip", default="",
                    help="comma list of: numba, q4_1, transformers, llama_cpp")  # fmt: skip
    ap.add_argument("--threads", type=int, default=0, help="torch (and llama.cpp) threads")
    args = ap.parse_args()
    if args.threads:
        # On a shared 2-core VM a co-tenant descheduling one of two OpenMP threads stalls
        # every parallel op (a 30 µs attention took 8 ms): one thread is then faster.
        torch.set_num_threads(args.threads)
    skip = set(filter(None, args.skip.split(",")))
    path = preset_file("smollm2-135m")
    cfg = read_gguf_config(path)
    with open("/proc/cpuinfo") as fh:
        cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")),
                   platform.processor())  # fmt: skip
    import transformers

    print(f"machine: {cpu}, {torch.get_num_threads()} torch threads, Python "
          f"{platform.python_version()}, torch {torch.__version__}, transformers "
          f"{transformers.__version__}")  # fmt: skip
    ceilings = []  # measured before and after each subject: a co-tenant only lowers them

    def measure_ceilings():
        ceilings.append((copy_bandwidth(), read_bandwidth(), gemm_flops()))

    measure_ceilings()

    results = {}
    # (name, weights, kernel backend): torch is the default path; numba fuses the small ops
    # of decode steps (engine_ref/cpu_kernels.py)
    subjects = [("engine_ref float", "float", "torch"),
                ("engine_ref float numba", "float", "numba"),
                ("engine_ref q4_1", "q4_1", "torch")]  # fmt: skip
    for name, fmt, kernels in subjects:
        if fmt in skip or kernels in skip:
            continue
        cache = CacheConfig(enable_prefix_caching=False)  # every round computes its prompt
        engine = LLMEngine(EngineConfig(model=cfg, model_path=str(path), max_model_len=2048,
                                        weight_format=fmt, cache=cache,
                                        kernel_backend=kernels))  # fmt: skip
        tok = engine.tokenizer
        prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": TEXT}]))
        long_ids = (tok.encode(TEXT * 20))[: args.prefill]
        results[name] = engine_times(engine, prompt, long_ids, args.tokens, args.rounds)
        del engine
        measure_ceilings()
    if "transformers" not in skip:
        results["transformers float"] = hf_times(path, prompt, long_ids, args.tokens, args.rounds)
    if "llama_cpp" not in skip:
        try:
            results["llama.cpp (Q4_1)"] = llama_cpp_times(path, prompt, long_ids, args.tokens,
                                                          args.rounds)  # fmt: skip
        except ImportError:
            print("llama.cpp: llama-cpp-python is not installed (skipped)")

    measure_ceilings()
    bw, read_bw, peak = (max(c[i] for c in ceilings) for i in range(3))
    print(f"ceilings (best of {len(ceilings)}): copy_ 1 GiB {bw / 1e9:.1f} GB/s (read+write), "
          f"read (sum) 1 GiB {read_bw / 1e9:.1f} GB/s, fp32 GEMM 2048² {peak / 1e9:.1f} "
          f"GFLOP/s")  # fmt: skip
    f32 = ModelShape.from_dict(
        {"hidden_size": cfg.hidden_size, "num_layers": cfg.num_layers,
         "num_heads": cfg.num_heads, "num_kv_heads": cfg.num_kv_heads,
         "head_dim": cfg.head_dim, "intermediate_size": cfg.intermediate_size,
         "vocab_size": cfg.vocab_size}, dtype="float32",
    )  # fmt: skip
    ctx = len(prompt) + args.tokens // 2
    decode_shape = StepShape.from_sequences(decode=[ctx])
    prefill_shape = StepShape.from_sequences(prefill=[(len(long_ids), 0)])
    print(
        f"model: {cfg.name}, {cfg.num_params / 1e6:.1f} M params, {cfg.num_layers} layers, "
        f"GQA {cfg.num_heads}:{cfg.num_kv_heads}; decode prompt {len(prompt)} tokens, "
        f"{args.tokens} decoded; prefill {len(long_ids)} tokens; best of {args.rounds}"
    )
    floor_bytes = float(step_totals(f32, decode_shape)[1])
    floor, read_floor = floor_bytes / bw, floor_bytes / read_bw
    print(
        f"decode floor (float32): {floor_bytes / 1e6:.1f} MB a step / copy bw = "
        f"{floor * 1e3:.1f} ms ({1 / floor:.1f} tok/s); / read bw = {read_floor * 1e3:.1f} ms"
    )
    print(f"{'':22} {'decode tok/s':>12} {'ms/token':>9} {'x floor':>8} {'x read floor':>13} "
          f"{'prefill tok/s':>14}")  # fmt: skip
    for name, (dec, pre) in results.items():
        print(f"{name:22} {1 / dec:12.1f} {dec * 1e3:9.1f} {dec / floor:8.2f} "
              f"{dec / read_floor:13.2f} {len(long_ids) / pre:14.1f}")  # fmt: skip
    engines = [name for name, _, _ in subjects if name in results]
    for name, fmt, _ in subjects:
        if name in results:
            m = for_weight_format(f32, fmt)
            dec, pre = results[name]
            label = name.removeprefix("engine_ref ")
            print(f"roofline {label:11} decode : {position(m, decode_shape, dec, bw, peak)}")
            print(f"roofline {label:11} prefill: {position(m, prefill_shape, pre, bw, peak)}")
    if "transformers float" in results:
        h = results["transformers float"]
        for key in (k for k in engines if " float" in k):
            e = results[key]
            print(f"{key} / transformers (float32): decode {h[0] / e[0]:.2f}x, prefill "
                  f"{h[1] / e[1]:.2f}x")  # fmt: skip
    if "llama.cpp (Q4_1)" in results:
        ll = results["llama.cpp (Q4_1)"]
        for key in engines:
            e = results[key]
            print(f"{key} / llama.cpp: decode tok/s ratio {ll[0] / e[0]:.2f}, prefill "
                  f"{ll[1] / e[1]:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
