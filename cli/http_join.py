"""`perfdiag join CLIENT_RUN SERVER_RUN`: a load client's HTTP run joined with the run of
the `perfdiag serve` it drove — where each request's time to first token went."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ..errors import ConfigError
from .app import app, out
from .json_output import print_json


@app.command()
def join(
    client_run: Annotated[Path, typer.Argument(help="The run `perfdiag run --target` recorded.")],
    server_run: Annotated[Path, typer.Argument(help="The run `perfdiag serve` recorded.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """Join client and server runs by x-request-id, align clocks, decompose TTFT."""
    from ..analyzers.http_join import join_runs
    from ..analyzers.lifecycle import Missing
    from ..analyzers.serving import to_jsonable
    from ..traces.reader import load_run

    client, server = load_run(client_run), load_run(server_run)
    result = join_runs(client, server)
    if isinstance(result, Missing):
        raise ConfigError(f"cannot join: the runs lack {', '.join(result.needs)}")
    expected = client.manifest.config.get("target", {}).get("perfdiag_run")
    mismatch = expected and expected != server.manifest.run_id
    if as_json:
        payload = {"clock": to_jsonable(result.clock), "matched": result.matched,
                   "client_only": result.client_only, "server_only": result.server_only,
                   "summary": to_jsonable(result.summary)}  # fmt: skip
        print_json(payload)
        return
    c = result.clock
    out.print(f"clock: server − client = {c.offset_ns / 1e3:.1f} µs ± {c.uncertainty_ns / 1e3:.1f}"
              f" µs ({c.method}, {c.samples} round trips; manifests say "
              f"{c.manifest_offset_ns / 1e3:.1f} µs)", highlight=False)  # fmt: skip
    out.print(f"requests: {result.matched} in both runs, {result.client_only} client only, "
              f"{result.server_only} server only", highlight=False)  # fmt: skip
    if mismatch:
        out.print(f"[yellow]warning[/]: the client drove server run {expected}, "
                  f"not {server.manifest.run_id}")  # fmt: skip
    t = Table(title="time to first token, joined (client wait + TTFT)", title_justify="left")
    for col in ("part", "mean ms", "p50 ms", "p99 ms", "share"):
        t.add_column(col, justify="left" if col == "part" else "right")
    for row in result.summary.itertuples():
        t.add_row(row.part.removesuffix("_s"), f"{row.mean_s * 1e3:.2f}",
                  f"{row.p50_s * 1e3:.2f}", f"{row.p99_s * 1e3:.2f}",
                  f"{row.share:.0%}")  # fmt: skip
    out.print(t)
