"""What a run's manifest says the engine was configured with: `perfdiag run`'s options
(`config.run_options.engine`) first, else the engine's own configuration
(`config.engine_config.<section>`, as `perfdiag serve` records it)."""

from __future__ import annotations


def engine_setting(config: dict | None, option: str, section: str, key: str):
    """The setting, or None when the run did not record it."""
    config = config or {}
    engine = (config.get("run_options") or {}).get("engine") or {}
    if option in engine:
        return engine[option]
    return ((config.get("engine_config") or {}).get(section) or {}).get(key)
