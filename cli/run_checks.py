"""What `perfdiag run` checks before it imports torch and builds the engine: a bad
option is then one line in a fraction of a second, not after the 5–20 s that loading
torch takes on a cold machine."""

from __future__ import annotations


def check_before_engine(options) -> None:
    """The engine's own configuration checks (model, cache, scheduler, dtype, weights,
    parallelism), run on the options alone. A model read from a file or directory is
    checked when it is loaded: reading it is the engine's work."""
    engine = options.engine
    if engine.model_file or engine.model_dir:
        return
    from ..engine_ref.preset_names import FILE_PRESETS

    if engine.preset in FILE_PRESETS:
        return
    engine.engine_config()  # raises ConfigError naming the option
