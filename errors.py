"""One error family: anything a user can cause is a PerfdiagError.

The CLI turns a PerfdiagError into one line on stderr and exit code 1; anything else
escaping is a bug in perfdiag: one line too, exit code 70, and its traceback saved to a
file (printed with PERFDIAG_DEBUG=1).
"""


class PerfdiagError(Exception):
    """Base of every error perfdiag reports to a user as one line."""


class RunNotFoundError(PerfdiagError):
    """The path does not hold a run."""


class RunFormatError(PerfdiagError):
    """A run's manifest or tables are missing, corrupt or inconsistent."""


class SchemaVersionError(RunFormatError):
    """A run was written by a newer schema than this perfdiag reads."""


class ConfigError(PerfdiagError):
    """A configuration, option or input file is invalid."""
