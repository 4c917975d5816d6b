"""The explorer's application: opens the runs, analyses them in a background worker while
the overview is already on screen, and routes the keys that work everywhere.

`make_app(runs_or_paths, ...)` is the factory the CLI and the tests use; tests pass Run
objects (or paths) and wait for `app.workers.wait_for_complete()` before asserting.
"""

from __future__ import annotations

import os
from pathlib import Path

from textual.app import App
from textual.binding import Binding
from textual.worker import get_current_worker

from ..errors import PerfdiagError
from ..traces.reader import Run
from .data import RunData, open_run

Source = Run | RunData | str | os.PathLike


class PerfdiagApp(App):
    """`perfdiag tui RUN [RUN_B]`: the triage, its evidence, and every request and step."""

    CSS_PATH = "app.tcss"
    TITLE = "perfdiag"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("question_mark", "help", "Help"),
        Binding("escape", "back", "Back"),
        Binding("o", "overview", "Overview", show=False),
        Binding("r", "open('requests')", "Requests"),
        Binding("t", "open('steps')", "Steps"),
        Binding("y", "open('roofline')", "Roofline", show=False),
        Binding("c", "open('compare')", "Compare"),  # shown with two runs only
        Binding("b", "switch_run", "Other run"),
        *[Binding(str(n), f"open('step{n}')", f"Step {n}", show=False) for n in range(8)],
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, sources: list[Source], *, slo=None, steady: bool = True,
                 ceilings_dir: Path | None = None):  # fmt: skip
        super().__init__()
        if not 1 <= len(sources) <= 2:
            raise PerfdiagError("give one run, or two to compare")
        self.sources = list(sources)
        self.slo, self.steady, self.ceilings_dir = slo, steady, ceilings_dir
        self.datasets: list[RunData] = []
        # which run the screens explore: the run under study (B) when there are two
        self.current = len(self.sources) - 1
        self.comparison = None  # analyzers.compare.Comparison, once both runs are analysed
        self.progress = ("opening", 0.0)
        self.error: Exception | None = None  # what ended the app, raised by the CLI

    @property
    def data(self) -> RunData:
        return self.datasets[self.current]

    def on_mount(self) -> None:
        try:
            for i, src in enumerate(self.sources):
                self.datasets.append(self._open(src, "AB"[i]))
        except PerfdiagError as e:
            self.fail(e)
            return
        from .screens.overview import OverviewScreen

        self.push_screen(OverviewScreen(self.data))
        self.run_worker(self._analyse, thread=True, exclusive=True, name="analyse")

    def _open(self, src: Source, label: str) -> RunData:
        if isinstance(src, RunData):
            return src
        return RunData(open_run(src), label=label, slo=self.slo, steady=self.steady,
                       ceilings_dir=self.ceilings_dir)  # fmt: skip

    def _analyse(self) -> None:
        """Background worker: each run's analyses, then the comparison; the screens are
        told after every stage, so what is ready shows at once."""
        worker = get_current_worker()
        try:
            for i, data in enumerate(self.datasets):
                if data.ready:
                    continue

                def report(stage: str, done: float, i=i) -> None:
                    label = (
                        f"run {self.datasets[i].label}: {stage}"
                        if len(self.datasets) > 1
                        else stage
                    )
                    share = (i + done) / len(self.datasets)
                    self.call_from_thread(self._advance, label, share)

                data.analyse(report)
                if worker.is_cancelled:
                    return
            if len(self.datasets) == 2 and self.comparison is None:
                self.call_from_thread(self._advance, "comparing the runs", 0.99)
                self.comparison = compare_runs(*self.datasets)
            self.call_from_thread(self._advance, "ready", 1.0)
        except PerfdiagError as e:
            self.call_from_thread(self.fail, e)

    def _advance(self, stage: str, share: float) -> None:
        self.progress = (stage, share)
        for screen in self.screen_stack:
            changed = getattr(screen, "data_changed", None)
            if changed is not None:
                changed()

    def fail(self, error: PerfdiagError) -> None:
        """A run that cannot be read ends the app; the CLI prints the one line."""
        self.error = error
        self.exit(return_code=1)

    def _handle_exception(self, error: Exception) -> None:
        # Textual's own handler prints a full-screen traceback and leaves exit code 0 to the
        # caller; here the app ends and the CLI reports the error in one line (a
        # PerfdiagError as any other, anything else as a bug, its traceback in a file).
        if isinstance(error, PerfdiagError):
            self.fail(error)
            return
        self.error = error
        if self._exception is None:  # what run_test() re-raises in tests
            self._exception = error
            self._exception_event.set()
        self.exit(return_code=1)

    def check_action(self, action: str, parameters) -> bool | None:
        """The two-run keys (compare, other run) are shown, and work, with two runs."""
        if action == "switch_run" or (action == "open" and parameters == ("compare",)):
            return len(self.sources) > 1
        return True

    # -- navigation ----------------------------------------------------------------
    def action_help(self) -> None:
        from .screens.help import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_back(self) -> None:
        if len(self.screen_stack) > 2:  # the default screen, then the overview
            self.pop_screen()

    def action_overview(self) -> None:
        while len(self.screen_stack) > 2:
            self.pop_screen()

    def action_open(self, name: str) -> None:
        from .screens import screen_for

        screen = screen_for(name, self)
        if screen is None:
            return
        if type(self.screen) is type(screen) and getattr(self.screen, "key", None) == getattr(
            screen, "key", None
        ):
            return  # already there
        self.push_screen(screen)

    def action_switch_run(self) -> None:
        if len(self.datasets) < 2:
            self.notify("one run only: give two runs to switch between them")
            return
        from .screens.overview import OverviewScreen

        self.current = 1 - self.current
        while len(self.screen_stack) > 2:
            self.pop_screen()
        self.switch_screen(OverviewScreen(self.data))


def compare_runs(a: RunData, b: RunData):
    from ..playbooks.comparison import compare

    return compare(a.ctx, b.ctx)


def make_app(runs_or_paths, *, slo=None, steady: bool = True,
             ceilings_dir: Path | None = None) -> PerfdiagApp:  # fmt: skip
    """The explorer over one run, or two (A the baseline, B compared with it)."""
    sources = (
        [runs_or_paths] if isinstance(runs_or_paths, Run | RunData | str | os.PathLike)
        else list(runs_or_paths)
    )  # fmt: skip
    return PerfdiagApp(sources, slo=slo, steady=steady, ceilings_dir=ceilings_dir)
