"""A sweep point's (or a capacity level's) limiting cause, and how it reads.

The limiting cause is the triage's top cause, less the checks that describe the
measurement rather than the engine: `littles-law` says the window is not stable or
requests are counted at different boundaries; when nothing else fired, that is a caveat
on the numbers (the point's qualifier), not what limits the point.

People read the cause as the finding's title up to its details ("Queue wait is 80% of
TTFT"); the check id stays in the tables (points.csv `cause`) for scripts.
"""

from __future__ import annotations

NOT_A_LIMIT = frozenset({"littles-law"})
NONE = "none (no warning)"


def limiting_cause(triage):
    """The first cause (warning or critical, steps 2-7, ranked) that names a limit."""
    return next((f for f in triage.causes if f.check not in NOT_A_LIMIT), None)


def measurement_caveat(triage):
    """A fired measurement check that is not a limit, when one fired."""
    return next((f for f in triage.causes if f.check in NOT_A_LIMIT), None)


def readable(check, title) -> str:
    """The cause in words: its title before the details (`: …`); the id when no title
    was recorded; "none (no warning)" for a healthy point."""
    check = "" if check is None or check != check else str(check)  # NaN from a table
    title = "" if title is None or title != title else str(title)
    if check in ("", "none"):
        return NONE
    if not title:
        return check
    return title.split(": ", 1)[0].strip()
