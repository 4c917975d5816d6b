"""Shared test set-up. Triton kernels run in interpreter mode on the CPU, which must be
chosen before any kernel module is imported."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
