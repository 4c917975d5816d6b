"""The explorer's screens, one module each; `screen_for(name, app)` maps a key's target
(requests, steps, roofline, compare, trace_diff, step0 … step7) to a new screen on the app's run."""

from __future__ import annotations


def screen_for(name: str, app):
    data = app.data
    if name == "requests":
        from .requests import RequestsScreen

        return RequestsScreen(data)
    if name == "steps":
        from .steps import StepsScreen

        return StepsScreen(data)
    if name == "roofline":
        from .roofline import RooflineScreen

        return RooflineScreen(data)
    if name == "compare" or (name in ("step6", "step7") and len(app.datasets) == 2):
        if len(app.datasets) < 2:
            app.notify("give two runs to compare: perfdiag tui RUN_A RUN_B")
            return None
        from .compare import CompareScreen

        return CompareScreen(data)
    if name == "trace_diff":
        if app.comparison is None or app.comparison.trace is None:
            app.notify("no trace diff: give two runs that hold spans (a profiler window)")
            return None
        from .trace_diff import TraceDiffScreen

        return TraceDiffScreen(data)
    if name.startswith("step"):
        return step_screen(int(name[4:]), data)
    return None


def step_screen(step: int, data):
    if step == 2:
        from .load import LoadScreen

        return LoadScreen(data)
    if step == 3:
        from .latency import LatencyScreen

        return LatencyScreen(data)
    if step == 4:
        from .resources import ResourcesScreen

        return ResourcesScreen(data)
    if step == 5:
        from .cache import CacheScreen

        return CacheScreen(data)
    from .checks import ChecksScreen

    return ChecksScreen(data, step)
