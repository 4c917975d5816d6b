"""What a run's manifest says the engine was configured with: `perfdiag run`'s options
(`config.run_options.engine`) first, else the engine's own configuration
(`config.engine_config.<section>`, as `perfdiag serve` records it)."""

from __future__ import annotations


def section(mapping, *keys: str) -> dict:
    """`mapping[k1][k2]…` when every level is a dict, else {} (a manifest edited by hand
    or written by another tool may hold anything there)."""
    for key in keys:
        mapping = mapping.get(key) if isinstance(mapping, dict) else None
    return mapping if isinstance(mapping, dict) else {}


def engine_setting(config: dict | None, option: str, section_name: str | None, key: str):
    """The setting, or None when the run did not record it (`section_name` None: a key
    at the top of the engine's config, such as `device`)."""
    engine = section(config, "run_options", "engine")
    if option in engine:
        return engine[option]
    return section(config, "engine_config", *([section_name] if section_name else [])).get(key)
