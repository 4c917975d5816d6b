"""perfdiag: profiling and performance diagnosis for LLM inference.

The public API is small and imported lazily, so `import perfdiag` (and the CLI's
`--version`) stays fast and pulls in neither pandas nor torch:

    run = perfdiag.load_run("runs/2026-11-30T10-00-00")
    run.manifest.status, run.spans, run.steps
"""

import os

# Arrow's buffers from the C allocator numpy and pandas use, so what Arrow frees (an
# import's batches, a Parquet read) serves the frames that follow: peak memory of an
# import + timeline 296 → 265 MB at 412k events (traces/arrow_memory.py). Read once, when
# pyarrow loads; a pool the user chose is kept.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

from ._version import __version__
from .errors import PerfdiagError

__all__ = ["PerfdiagError", "Run", "RunWriter", "__version__", "load_run"]


def __getattr__(name: str):
    if name in ("load_run", "Run"):
        from .traces import reader

        return getattr(reader, name)
    if name == "RunWriter":
        from .traces.writer import RunWriter

        return RunWriter
    raise AttributeError(f"module 'perfdiag' has no attribute {name!r}")
