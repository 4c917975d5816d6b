"""Read a user's YAML file (workload, SLO, playbook) as a mapping, or fail in one line."""

from __future__ import annotations

from pathlib import Path

import yaml

from .errors import ConfigError


def read_yaml_mapping(
    path: str | Path,
    what: str,
    shape: str = "a mapping",
    error: type[ConfigError] = ConfigError,
) -> dict:
    """The mapping in `path`; `error` names the file, the line and the problem otherwise.
    `what` says which file it is ("the workload file"), `shape` what it must hold."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise error(f"{path}: cannot read {what} ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise error(f"{path}: {what} is not UTF-8 text (byte {e.start})") from None
    except RecursionError:
        raise error(f"{path}: {what} is nested too deeply") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise error(f"{path}: {where}not valid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(data, dict):
        raise error(f"{path}: {what} must hold {shape}")
    return data
