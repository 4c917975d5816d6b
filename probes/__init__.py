"""Instrumentation: request lifecycle, scheduler steps, profiler windows, device sampling."""
