"""Device facts below every layer: datasheet peaks and the ceilings `perfdiag calibrate`
measured. The engine's kernel benchmark, the probes that measure and the analyzers that
judge all read them here; this package imports nothing heavy and none of them."""
