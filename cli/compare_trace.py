"""The trace diff in `perfdiag compare` (analyzers/trace_diff.py): what was added or
removed and what changed in calls and time per step, GPU and CPU apart, then the launches
by API and the copies by kind."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from ..analyzers.names import short_name
from ..analyzers.trace_diff import TraceDiff
from .app import out
from .fit import fit

NAME_MAX = 70  # a kernel's templated name is cut here in tables (kept whole in --json)
STATUS_STYLE = {"added": "yellow", "removed": "cyan", "changed": "", "same": "dim"}
_SIDE_TITLE = {
    "gpu": "GPU work (kernels, copies, memsets, collectives)",
    "cpu": "CPU ops and annotations (inclusive time)",
}


def _short(name: str, limit: int = NAME_MAX) -> str:
    return short_name(name, limit)


def _ms(ns: float) -> str:
    return "" if ns != ns else f"{ns / 1e6:,.3f}"


def _signed_ms(ns: float) -> str:
    return "" if ns != ns else f"{ns / 1e6:+,.3f}"


def _calls(n: float) -> str:
    if n != n:
        return ""
    return f"{n:,.0f}" if abs(n - round(n)) < 0.05 else f"{n:,.1f}"


def _signed_calls(n: float) -> str:
    return "" if n != n else ("+" if n > 0 else "") + _calls(n)


def _bytes(b: float) -> str:
    if b != b:
        return ""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(b) >= size:
            return f"{b / size:,.1f} {unit}"
    return f"{b:,.0f} B"


def _names(frame, n: int = 3) -> str:
    shown = [f"{escape(_short(str(r.name), 48))} ({_signed_ms(r.time_delta_ns)} ms)"
             for r in frame.head(n).itertuples()]  # fmt: skip
    more = f" and {len(frame) - n} more" if len(frame) > n else ""
    return ", ".join(shown) + more


def print_trace_diff(d: TraceDiff, top: int = 10) -> None:
    out.print("[bold]trace diff[/] (B − A, per step)", highlight=False)
    out.print(f"  steps: A {d.basis_a.text}; B {d.basis_b.text}", highlight=False)
    if "trace" in (d.basis_a.source, d.basis_b.source):
        out.print(
            "  [yellow]a trace without steps[/]: its counts are per trace, so they compare "
            "only if both traces cover the same work",
            highlight=False,
        )
    _headline(d)
    for status, word in (("added", "added in B"), ("removed", "only in A")):
        for side in ("gpu", "cpu", "runtime"):
            rows = d.ops[(d.ops["status"] == status) & (d.ops["side"] == side)]
            if len(rows):
                label = {"gpu": "GPU", "cpu": "CPU", "runtime": "runtime"}[side]
                out.print(f"  {word} ({label}, {len(rows)}): {_names(rows)}", highlight=False)
    for side in ("gpu", "cpu"):
        _ops_table(d, side, top)
    _launch_table(d)
    _copy_table(d)


def _headline(d: TraceDiff) -> None:
    parts = []
    for row in d.totals.itertuples():
        if row.unit == "ns":
            parts.append(f"{row.metric} {_ms(row.a)} → {_ms(row.b)} ms")
        else:
            parts.append(f"{row.metric} {_calls(row.a)} → {_calls(row.b)}")
    out.print("  " + "; ".join(parts), highlight=False)


def _ops_table(d: TraceDiff, side: str, top: int) -> None:
    rows = d.ops[(d.ops["side"] == side) & (d.ops["status"] != "same")]
    if not len(rows):
        return
    t = Table(
        "name",
        "calls A",
        "calls B",
        "Δ calls",
        "ms A",
        "ms B",
        "Δ ms",
        "change",
        title=f"{_SIDE_TITLE[side]}: top {min(top, len(rows))} of {len(rows)} changes by |Δ ms|",
        title_justify="left",
    )
    for r in rows.head(top).itertuples():
        style = STATUS_STYLE[r.status]
        t.add_row(
            escape(_short(str(r.name))),
            _calls(r.calls_a),
            _calls(r.calls_b),
            _signed_calls(r.calls_delta),
            _ms(r.time_a_ns),
            _ms(r.time_b_ns),
            _signed_ms(r.time_delta_ns),
            f"[{style}]{r.status}[/]" if style else r.status,
        )
    out.print(fit(t, out, keep=["Δ ms"], drop=["ms A", "calls A"]))


def _launch_table(d: TraceDiff) -> None:
    lt = d.launches
    launching = lt[(lt["ops_a"] > 0) | (lt["ops_b"] > 0)]
    if not len(launching):
        return
    t = Table(
        "launch API",
        "calls A",
        "calls B",
        "Δ calls",
        "ops A",
        "ops B",
        "Δ call ms",
        title="launches by kind (per step; ops: GPU ops each launched)",
        title_justify="left",
    )
    for r in launching.itertuples():
        t.add_row(
            escape(str(r.launch_name)),
            _calls(r.calls_a),
            _calls(r.calls_b),
            _signed_calls(r.calls_delta),
            _calls(r.ops_a),
            _calls(r.ops_b),
            _signed_ms(r.call_time_ns_delta),
        )
    out.print(fit(t, out, keep=["Δ calls"]))
    others = lt[(lt["ops_a"] == 0) & (lt["ops_b"] == 0) & (lt["calls_delta"] != 0)]
    if len(others):
        shown = ", ".join(
            f"{escape(str(r.launch_name))} {_signed_calls(r.calls_delta)}"
            for r in others.head(4).itertuples()
        )
        more = f" and {len(others) - 4} more" if len(others) > 4 else ""
        out.print(f"  other runtime calls per step: {shown}{more}", highlight=False)


def _copy_table(d: TraceDiff) -> None:
    c = d.copies
    if not len(c):
        return
    t = Table(
        "copy kind",
        "calls A",
        "calls B",
        "Δ calls",
        "ms A",
        "ms B",
        "bytes A",
        "bytes B",
        title="copies by kind (per step)",
        title_justify="left",
    )
    for r in c.itertuples():
        t.add_row(
            str(r.copy_kind),
            _calls(r.calls_a),
            _calls(r.calls_b),
            _signed_calls(r.calls_delta),
            _ms(r.time_ns_a),
            _ms(r.time_ns_b),
            _bytes(r.bytes_a),
            _bytes(r.bytes_b),
        )
    out.print(fit(t, out, keep=["Δ calls"], drop=["bytes A", "bytes B"]))
