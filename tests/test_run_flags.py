"""The run flags' table (probes/run_flags.py, which sweeps and capacity read) against
`perfdiag run`'s typer signature (what users type): the two must not drift."""

import inspect
import types
import typing

from perfdiag.cli.run import run
from perfdiag.probes.run_flags import RUN_FLAGS, engine_flags, flag_types, run_flag_defaults


def _signature_flags() -> dict[str, tuple[type, str | None, object]]:
    """(value type, help panel, default) per parameter of `perfdiag run`."""
    hints = typing.get_type_hints(run, include_extras=True)
    out = {}
    for name, param in inspect.signature(run).parameters.items():
        hint = hints[name]
        kind, meta = typing.get_args(hint)[0], hint.__metadata__
        if isinstance(kind, types.UnionType):
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        panel = next(getattr(m, "rich_help_panel", None) for m in meta)
        out[name] = (kind, panel, param.default)
    return out


def test_the_table_is_the_signature():
    table = {f.name: (f.type, f.panel, f.default) for f in RUN_FLAGS}
    assert table == _signature_flags()
    assert [f.name for f in RUN_FLAGS] == list(inspect.signature(run).parameters)


def test_views_of_the_table():
    assert run_flag_defaults()["no_chunked_prefill"] is False
    assert run_flag_defaults()["preset"] is None
    assert flag_types()["chunk_size"] is int and flag_types()["rate"] is float
    assert {"preset", "chunk_size", "tp", "no_chunked_prefill"} <= engine_flags()
    assert not {"rate", "workload", "target", "out_dir"} & engine_flags()


def test_sweeps_and_capacity_do_not_need_the_cli():
    """The sweep's flag vocabulary comes from the table: the same flags as before."""
    from perfdiag.sweeps.spec import NOT_SWEEPABLE
    from perfdiag.sweeps.spec import engine_flags as sweep_engine_flags
    from perfdiag.sweeps.spec import flag_types as sweep_flag_types

    assert set(sweep_flag_types()) == {f.name for f in RUN_FLAGS} - set(NOT_SWEEPABLE)
    assert sweep_engine_flags() == engine_flags()
