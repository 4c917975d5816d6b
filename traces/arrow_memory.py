"""Memory between the steps of an analysis.

perfdiag asks Arrow for the C allocator (perfdiag/__init__.py sets
ARROW_DEFAULT_MEMORY_POOL=system unless the user chose a pool, before pyarrow loads):
pyarrow's default, mimalloc, keeps what it frees for Arrow alone, so after a trace's
import or a Parquet read the next pandas frame could not reuse those pages and the
process's peak grew by their size. Measured on a 412k-event Kineto trace: import +
timeline peak 296 → 265 MB, no slower (BENCHMARKS.md, issue 16).
"""

from __future__ import annotations

import gc

import pyarrow as pa


def release_freed_memory() -> None:
    """Hand memory freed by a large step (an import) back to the system, so the work
    after it starts from a smaller resident set: collects Python's cycles, then asks
    the pool to return its free pages (malloc_trim for the system allocator)."""
    gc.collect()
    pa.default_memory_pool().release_unused()
