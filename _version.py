"""The single source of perfdiag's version (read by pyproject.toml and the manifest)."""

__version__ = "0.1.0"
