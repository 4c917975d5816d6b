"""Names in a vLLM server's own profiler trace that perfdiag reads, kept below both the
probes that record such a trace and the analyzers that read it."""

from __future__ import annotations

import re

# vLLM's annotation around one engine step (a model execution), step number optional.
VLLM_STEP = re.compile(r"^execute_(\d+_)?context_")
