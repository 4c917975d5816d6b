"""What every screen of the explorer shares: a title line naming the run and the place,
a body built from the run's data, the footer of bindings, and a rebuild when the
background analysis brings new data."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from ..data import RunData


class RunScreen(Screen):
    """A screen about one run. Subclasses write `body()`; when they need the analyses
    (`needs_analysis`) they show the analysis' progress until it is done."""

    AUTO_FOCUS = "DataTable"  # the first table, not the scrolling body around it
    name_text = ""
    needs_analysis = True
    key: object = None  # tells two screens of one class apart (a request id, a step)

    def __init__(self, data: RunData) -> None:
        super().__init__()
        self.data = data
        self._built_ready = None
        # screens with a `prepare` (heavy data: the timeline, the roofline) build it in a
        # thread and show a waiting line meanwhile
        self._prepared = type(self).prepare is RunScreen.prepare
        self._preparing = False

    def compose(self) -> ComposeResult:
        yield Static(self.title_text(), id="title", markup=False)
        ready = self.data.ready or not self.needs_analysis
        self._built_ready = ready
        if ready and self._prepared:
            yield from self.body()
        elif ready:
            yield VerticalScroll(Static(self.preparing_text, id="waiting", markup=False))
            if not self._preparing:
                self._preparing = True
                self.run_worker(self._prepare, thread=True, name="prepare")
        else:
            yield VerticalScroll(Static(self.waiting_text(), id="waiting", markup=False))
        yield Footer(show_command_palette=False)

    def body(self) -> ComposeResult:
        yield from ()

    preparing_text = "reading the run…"

    def prepare(self) -> None:
        """Heavy data `body` needs, built in a worker thread (none by default)."""

    def _prepare(self) -> None:
        self.prepare()
        self.app.call_from_thread(self._prepare_done)

    def _prepare_done(self) -> None:
        self._prepared = True
        self.call_later(self.rebuild)

    def title_text(self) -> str:
        d = self.data
        run = f"{d.label} {d.identity.run_id}" if len(self.app.datasets) > 1 else d.identity.run_id
        return f"perfdiag · {run} ({d.identity.status}) · {self.name_text}"

    def waiting_text(self) -> str:
        stage, share = self.app.progress
        return f"analysing the run… {stage} ({share:.0%})"

    def on_screen_resume(self) -> None:
        # focusing the first table scrolls down to it; a screen opens at its top
        self.call_after_refresh(self._to_top)

    def _to_top(self) -> None:
        for body in self.query("VerticalScroll"):
            body.scroll_home(animate=False)
            break

    async def rebuild(self) -> None:
        """Compose again (new data), then give the first table the focus."""
        await self.recompose()
        if self.focused is None:
            self.focus_first()
        self.refresh_bindings()  # a new footer learns the keys only when told
        self.call_after_refresh(self._to_top)

    def focus_first(self) -> None:
        from textual.widgets import DataTable

        for table in self.query(DataTable):
            if table.display:
                table.focus()
                return

    def data_changed(self) -> None:
        """The background analysis moved on: rebuild once the data this screen needs is
        there, else update the waiting line."""
        ready = self.data.ready or not self.needs_analysis
        if ready and not self._built_ready:
            self.call_later(self.rebuild)
        elif not ready:
            for w in self.query("#waiting"):
                w.update(self.waiting_text())
