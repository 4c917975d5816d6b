"""Importers: foreign traces (PyTorch-profiler / Kineto Chrome JSON, …) into the run format."""
