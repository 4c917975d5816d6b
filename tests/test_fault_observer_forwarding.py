"""The diagnosis faults' observer (probes/faults.py FaultObserver) wraps the run's
recorder: every hook of the engine's observer protocol must reach the recorder, or a run
with a fault silently loses a table (a TP run lost its collectives and workers' forwards)."""

from __future__ import annotations

import inspect

import pytest

from perfdiag.engine_ref.hooks import (
    EngineObserver,
    RequestEvent,
    RequestEventKind,
    StepBegin,
    StepEvent,
)
from perfdiag.probes.faults import FaultObserver, FaultOptions

HOOKS = sorted(
    name
    for name, member in vars(EngineObserver).items()
    if inspect.isfunction(member) and not name.startswith("_")
)
# Arguments the fault's own overrides read; any other hook gets opaque objects.
EVENTS = {
    "on_request": RequestEvent("r", RequestEventKind.TOKENIZED, 0, -1, 5),
    "on_step_begin": StepBegin(0, 0),
    "on_step": StepEvent(0, 0, 1, *([0] * 13)),
}


class _Calls(EngineObserver):
    """Records every hook call by name, whatever the hook (a new one included)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def __getattribute__(self, name: str):
        if name in HOOKS:
            return lambda *args: object.__getattribute__(self, "calls").append((name, args))
        return object.__getattribute__(self, name)


def test_the_protocol_has_the_hooks_this_test_walks():
    assert {"on_collectives", "on_rank_steps", "on_expert_loads", "on_step"} <= set(HOOKS)


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_reaches_the_wrapped_observer(hook):
    inner = _Calls()
    obs = FaultObserver(inner, FaultOptions(step_gap_ms=0.001))
    params = list(inspect.signature(getattr(EngineObserver, hook)).parameters)[1:]
    args = (EVENTS[hook],) if hook in EVENTS else tuple(object() for _ in params)
    getattr(obs, hook)(*args)
    assert inner.calls == [(hook, args)]


def test_a_tp_run_with_a_fault_keeps_every_ranks_collectives(tmp_path):
    """The defect's case: `step_gap_ms` on a TP = 2 run kept no collective (~4 s, a
    tiny run like test_engine_tp's); the run holds both ranks' and the worker's forwards."""
    from perfdiag import load_run
    from perfdiag.engine_ref import ModelConfig
    from perfdiag.probes.run_options import EngineOptions, ProbeOptions, RunOptions
    from perfdiag.probes.session import record_run
    from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec

    options = RunOptions(
        EngineOptions(preset="tiny", tp=2),
        WorkloadSpec(requests=3, warmup=0, seed=3, arrival=ArrivalSpec("closed", 3),
                     prompt_len=LengthSpec.parse("12"), output_len=LengthSpec.parse("4")),
        ProbeOptions(device_sampling=False),
    )  # fmt: skip
    faults = FaultOptions(step_gap_ms=1.0)
    record_run(options, tmp_path / "run", command=["pytest"], faults=faults)
    run = load_run(tmp_path / "run")
    assert run.manifest.config["faults"]["step_gap_ms"] == 1.0
    sp = run.spans
    comm = sp[(sp["category"] == "comm").to_numpy()]
    assert set(comm["rank"]) == {0, 1}
    layers = ModelConfig.preset("tiny").num_layers
    assert len(comm) == 2 * 2 * layers * len(run.steps)  # ranks x all-reduces x layers
    fwd = sp[(sp["name"] == "tp_forward").to_numpy()]
    assert len(fwd) == len(run.steps)
