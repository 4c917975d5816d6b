"""`perfdiag timeline RUN`: step-time breakdown, per-resource busy/idle, overlap, GPU idle
gaps by cause, launch delays and the top kernels and ops."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from .app import app, out
from .fit import fit
from .json_output import json_text, print_json
from .option_checks import check_ceilings_dir, check_top


def _ms(ns) -> str:
    return "" if ns is None or ns != ns else f"{ns / 1e6:,.3f}"


def _us(ns) -> str:
    return "" if ns is None or ns != ns else f"{ns / 1e3:,.1f}"


def _rank(key) -> str:
    return "-" if key == -1 else str(key)  # -1: the run has no rank


def _records(frame) -> list[dict]:
    return json.loads(frame.to_json(orient="records")) if len(frame) else []


@app.command()
def timeline(
    run: Annotated[Path, typer.Argument(help="A run directory (recorded or imported).")],
    top: Annotated[int, typer.Option(help="Rows in the kernel and op tables.")] = 10,
    max_windows: Annotated[
        int, typer.Option(help="Steps shown in the breakdown.", min=1, max=100_000)
    ] = 20,
    ceilings_dir: Annotated[
        Path | None, typer.Option(help="Measured ceilings to use (see `perfdiag calibrate`).")
    ] = None,
    hardware: Annotated[
        str | None,
        typer.Option(
            help="Judge the roofline against this device's datasheet (e.g. 'H100 SXM', "
            "'NVIDIA A100-SXM4-80GB') instead of the device the run recorded."
        ),
    ] = None,
    critical: Annotated[
        bool,
        typer.Option(
            "--critical-path/--no-critical-path",
            help="The critical path through the steps and what shortening its ops would save "
            "(eight replays of the trace: about 0.2 s per 100k events).",
        ),
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Where the time went: CPU, GPU, copies, communication and idle, step by step."""
    check_top(top)
    check_ceilings_dir(ceilings_dir)
    if hardware is not None:
        from ..hardware.ceilings import named

        named(hardware)  # an unknown name is an error before any work
    data = show_timeline(run, top=top, max_windows=max_windows, ceilings_dir=ceilings_dir,
                         hardware=hardware, critical=critical, as_json=as_json)  # fmt: skip
    if data is not None:
        print_json(data)


def show_timeline(
    run: Path,
    *,
    top: int = 10,
    max_windows: int = 20,
    ceilings_dir=None,
    hardware=None,
    critical: bool = True,
    as_json: bool = False,
) -> dict | None:
    """`perfdiag timeline`'s work on checked options (also `perfdiag import --timeline`'s,
    in the import's process): the tables printed, or with `as_json` the JSON document
    returned for the caller to print."""
    from ..analyzers.spans import CLASSES
    from ..traces.reader import load_run

    run, profile = _server_trace(run)
    loaded = load_run(run)
    rep, cp = _analyses(loaded, critical)
    roof = _roofline(loaded, ceilings_dir, hardware)
    if as_json:
        data = {name: _records(frame) for name, frame in rep.frames().items() if name != "gaps"}
        data["kernels_linked"] = rep.kernels_linked
        data["roofline"] = roof.to_dict()
        if cp is not None:
            data["critical_path"] = {k: _records(f) for k, f in cp.frames().items()}
        if profile is not None:
            data["trace_run"] = str(run)  # the client run's vLLM profiler trace
        return data
    if profile is not None:
        _say_server_trace(run, profile, rep)
    parts = [f"{c}_ns" for c in CLASSES] + ["idle_ns"]
    b = rep.breakdown
    shown, title = b.head(max_windows), "step-time breakdown (ms)"
    window = _profiled_steps(loaded)
    if window is not None and "step" in b:  # the steps with op-level detail come first
        first, last = window
        inside = b[(b["step"] >= first) & (b["step"] <= last)]
        if len(inside):
            shown = inside.head(max_windows)
            title = f"step-time breakdown (ms): the profiled window, steps {first}–{last}"
    t = Table("rank", "window", "wall ms", *[p[:-3] for p in parts], title=title)
    for _, row in shown.iterrows():
        t.add_row(
            _rank(row["rank_key"]),
            str(row["name"]),
            _ms(row["wall_ns"]),
            *[_ms(row[p]) for p in parts],
        )
    if len(b) > 1:
        t.add_row(
            "all", f"{len(b)} windows", _ms(b["wall_ns"].sum()), *[_ms(b[p].sum()) for p in parts]
        )
    out.print(fit(t, out))
    _between_steps(rep)
    r = rep.resources
    t = Table(
        "rank", "resource", "kind", "busy ms", "idle ms", "busy %", "spans", title="resources"
    )
    for _, row in r.iterrows():
        t.add_row(
            _rank(row["rank_key"]),
            row["resource"],
            row["kind"],
            _ms(row["busy_ns"]),
            _ms(row["idle_ns"]),
            f"{row['busy_pct']:.1f}",
            f"{row['spans']:,}",
        )
    out.print(fit(t, out))
    o = rep.overlap
    if len(o):
        t = Table(
            "rank",
            "compute",
            "copy",
            "comm",
            "copy∩compute",
            "comm∩compute",
            "exposed copy",
            "exposed comm",
            title="overlap (ms, all windows)",
        )
        for rank, g in o.groupby("rank_key"):
            cols = [
                "compute_ns",
                "copy_ns",
                "comm_ns",
                "compute_copy_overlap_ns",
                "compute_comm_overlap_ns",
                "exposed_copy_ns",
                "exposed_comm_ns",
            ]
            t.add_row(_rank(rank), *[_ms(g[c].sum()) for c in cols])
        out.print(fit(t, out))
    gs = rep.gap_summary
    if len(gs):
        t = Table(
            "rank",
            "cause",
            "gaps",
            "total ms",
            "mean µs",
            "p99 µs",
            "max µs",
            title="GPU idle gaps",
        )
        for _, row in gs.iterrows():
            t.add_row(
                _rank(row["rank_key"]),
                row["cause"],
                f"{row['gaps']:,}",
                _ms(row["total_ns"]),
                _us(row["mean_ns"]),
                _us(row["p99_ns"]),
                _us(row["max_ns"]),
            )
        out.print(fit(t, out))
    ls = rep.launch_stats
    if len(ls):
        t = Table(
            "launch",
            "ops",
            "call mean µs",
            "queue p50 µs",
            "queue p99 µs",
            "queue max µs",
            title=f"launches ({rep.kernels_linked:.1%} of kernels linked to their launch)",
        )
        for _, row in ls.iterrows():
            t.add_row(
                row["launch_name"],
                f"{row['ops']:,}",
                _us(row["call_mean_ns"]),
                _us(row["queue_p50_ns"]),
                _us(row["queue_p99_ns"]),
                _us(row["queue_max_ns"]),
            )
        out.print(fit(t, out))
    if cp is not None and len(cp.segments):
        print_critical_path(cp)
    for title, frame, key in (
        ("kernel classes", rep.kernel_classes, "kernel_class"),
        (f"top {top} kernels", rep.kernels.head(top), "name"),
    ):
        if not len(frame):
            continue
        t = Table(
            key.replace("_", " "), "count", "total ms", "mean µs", "p99 µs", "share %", title=title
        )
        for _, row in frame.iterrows():
            t.add_row(
                str(row[key])[:80],
                f"{row['count']:,}",
                _ms(row["total_ns"]),
                _us(row["mean_ns"]),
                _us(row["p99_ns"]),
                f"{row['share_pct']:.1f}",
            )
        out.print(fit(t, out))
    if len(rep.ops):
        t = Table(
            "name", "count", "self ms", "total ms", "mean µs", "p99 µs", "self %",
            title=f"top {top} CPU ops by self time (total: with the ops nested inside; "
            "self % adds up to 100)",
        )  # fmt: skip
        for _, row in rep.ops.head(top).iterrows():
            t.add_row(
                str(row["name"])[:80],
                f"{row['count']:,}",
                _ms(row["self_ns"]),
                _ms(row["total_ns"]),
                _us(row["mean_ns"]),
                _us(row["p99_ns"]),
                f"{row['self_share_pct']:.1f}",
            )
        out.print(fit(t, out))

    _print_roofline(roof)
    return None


def _server_trace(run: Path) -> tuple[Path, dict | None]:
    """A run against a vLLM launched with --server-profile holds the requests, not spans:
    its timeline is that of vLLM's profiler trace, imported beside it (server/trace)."""
    from ..errors import PerfdiagError
    from ..traces.manifest import read_manifest

    try:
        manifest = read_manifest(run)
    except PerfdiagError:
        return run, None  # load_run says what is wrong
    server = manifest.config.get("server") if isinstance(manifest.config, dict) else None
    profile = server.get("profile") if isinstance(server, dict) else None
    trace = profile.get("trace_run") if isinstance(profile, dict) else None
    if not isinstance(trace, str) or (manifest.tables.get("spans") or {}).get("rows"):
        return run, None
    return Path(run) / trace, profile


def _say_server_trace(trace: Path, profile: dict, rep) -> None:
    start, end = [*(profile.get("window_s") or []), None, None][:2]

    def sec(x) -> str:
        return f"{x:g}" if isinstance(x, (int, float)) else "?"

    window = f"{sec(start)}–{sec(end)} s" if end is not None else f"{sec(start)} s to the end"
    steps = int((rep.windows["source"] == "vllm").sum()) if "source" in rep.windows else 0
    out.print(
        f"vLLM's profiler trace ({profile['trace_run']}): {steps} steps (execute_context_* "
        f"annotations), profiled {window} into the workload; the requests are in "
        f"{trace.parents[1]} (perfdiag analyze {trace.parents[1]})",
        highlight=False,
        markup=False,
        soft_wrap=True,  # one line, however narrow the terminal
    )


def _analyses(run, critical: bool):
    """The timeline report and (when asked, and the run has GPU work) the critical path,
    from one read of the spans: the critical path is the heaviest step, so what the report
    freed is handed back first (on a 412k-event trace the process peaked ~60 MB higher)."""
    from ..analyzers.critical_path import critical_path
    from ..analyzers.report import report_from_spans
    from ..analyzers.spans import timeline_spans
    from ..traces.arrow_memory import release_freed_memory

    df = timeline_spans(run)
    rep = report_from_spans(df, run.steps)
    if not (critical and rep.gpu_ops):
        return rep, None
    release_freed_memory()
    return rep, critical_path(df, rep.windows)


def print_critical_path(cp) -> None:
    """The path by kind, then the ops that weigh most on it with what shortening each
    saves in a replay of the trace."""
    from rich.markup import escape

    from ..analyzers.names import short_name

    steps = max(int(cp.ranks["windows"].sum()), 1)
    k = cp.by_kind
    t = Table("rank", "kind", "class", "ms", "per step ms", "share %",
              title=f"critical path ({steps} steps; the chain the steps waited on)")  # fmt: skip
    for _, row in k.iterrows():
        t.add_row(_rank(row["rank_key"]), row["kind"], row["bound"], _ms(row["path_ns"]),
                  _ms(row["path_ns"] / steps), f"{100 * row['share']:.1f}")  # fmt: skip
    out.print(fit(t, out))
    items = cp.items[cp.items["saved_ns"].notna()]
    if not len(items):
        return
    t = Table("kind", "on the critical path", "path ms", "share %", "times", "if",
              "saves ms/step", title="the heaviest ops on the critical path, and what "
              "shortening each would save (a replay of the trace)")  # fmt: skip
    for _, row in items.iterrows():
        t.add_row(row["kind"], escape(short_name(row["name"], 60)), _ms(row["path_ns"]),
                  f"{100 * row['share']:.1f}", f"{row['pieces']:,}", row["what_if"],
                  _ms(float(row["saved_ns"]) / steps))  # fmt: skip
    out.print(fit(t, out))


def _profiled_steps(run) -> tuple[int, int] | None:
    """The engine steps a profiler window captured (--profile-steps), if any."""
    window = (run.manifest.extra or {}).get("profiler_window") or {}
    captured = window.get("captured_steps")
    if not captured or len(captured) != 2 or None in captured:
        return None
    return int(captured[0]), int(captured[1])


def _roofline(run, ceilings_dir, hardware=None):
    """The run's roofline, saved under results/ with the ceilings it used."""
    from ..analyzers.roofline import roofline_report
    from ..traces.atomic_file import write_atomic
    from ..traces.layout import RESULTS_DIR

    roof = roofline_report(run, ceilings_dir=ceilings_dir, hardware=hardware)
    try:
        results = Path(run.path) / RESULTS_DIR
        results.mkdir(exist_ok=True)
        write_atomic(results / "roofline.json", json_text(roof.to_dict()) + "\n")
    except PermissionError:
        pass  # a run the user may not write to still gets its roofline printed
    return roof


def _print_roofline(roof) -> None:
    from rich.markup import escape

    from ..analyzers.roof_check import over_roof_note

    c = roof.ceilings
    used = c.flops_dtype(roof.dtype)
    dtype = roof.dtype if used == roof.dtype else f"{roof.dtype}: none, {used}'s"
    how = "".join(
        f"; {label} {c.details[k]}"
        for k, label in (("reported", "reported as"), ("matched_by", "recognised by its"))
        if c.details.get(k)
    )
    out.print(
        f"roofline ceilings: {c.device} ({c.kind}{how}, {dtype} "
        f"{c.peak_flops(roof.dtype) / 1e12:,.3f} TFLOP/s, {c.bytes_per_s / 1e9:,.1f} GB/s) "
        f"from {c.source}",
        highlight=False,
        markup=False,
    )
    for title, frame, key in (
        ("roofline per step", roof.steps, "step_id"),
        ("roofline per span", roof.spans, "name"),
    ):
        if not len(frame):
            continue
        t = Table(key, "GFLOP", "MB", "FLOP/B", "TFLOP/s", "GB/s", "% roof", "bound", title=title)
        for _, row in frame.head(20).iterrows():
            t.add_row(
                str(row[key])[:60],
                f"{row['flops'] / 1e9:,.3f}",
                f"{row['bytes'] / 1e6:,.2f}",
                f"{row['intensity']:,.1f}",
                f"{row['attained_flops_per_s'] / 1e12:,.3f}",
                f"{row['attained_bytes_per_s'] / 1e9:,.1f}",
                f"{row['pct_of_roof']:,.1f}",
                row["bound"],
            )
        out.print(fit(t, out))
        counts = frame["bound"].value_counts().to_dict()
        out.print("bound classes: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
        note = over_roof_note(frame, c, "steps" if key == "step_id" else "spans")
        if note:
            out.print(f"[yellow]warning[/]: {escape(note)}", highlight=False)


def _between_steps(rep) -> None:
    """vLLM's steps span their model execution only: the time between them (the engine
    loop's scheduling and output handling, or no work) is said apart from the idle inside."""
    if not (rep.windows["source"] == "vllm").any():
        return
    for _, o in rep.outside.iterrows():
        idle_in = rep.breakdown.loc[rep.breakdown["rank_key"] == o["rank_key"], "idle_ns"].sum()
        out.print(
            f"vLLM steps (execute_context_* annotations), rank {_rank(o['rank_key'])}: "
            f"{_ms(o['inside_ns'])} ms inside steps ({_ms(idle_in)} ms of it idle), "
            f"{_ms(o['outside_ns'])} ms between steps ({_ms(o['host_outside_ns'])} ms of it "
            f"host work) of {_ms(o['extent_ns'])} ms traced",
            highlight=False,
        )
