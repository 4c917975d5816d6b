"""Recording data-parallel replicas (`perfdiag run --dp N`) into one run.

Every replica gets its own `RunRecorder` (its steps' rows carry `replica`, its thread's
CPU time, its own prefix-hit bookkeeping) behind a `ReplicaObserver` that renumbers its
steps from one counter shared by all replicas, so a step id names one step of the run
whatever the replica: request events and phase spans keep joining steps by `step_id`
alone. The load client's sink (`ReplicaSink`) files each request's row under the
replica the router chose.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator

from ..engine_ref.hooks import (
    NO_STEP,
    EngineObserver,
    PhaseEvent,
    RequestEvent,
    StepBegin,
    StepEvent,
)
from ..errors import ConfigError
from ..traces.environment import machine_cores
from .client import ClientResult
from .recorder import RunRecorder


class ReplicaObserver(EngineObserver):
    """One replica's hooks to its recorder, with run-wide step ids. Only the replica's
    stepping thread begins steps; events of other threads carry NO_STEP."""

    def __init__(self, inner: EngineObserver, step_ids: Iterator[int]) -> None:
        self.inner = inner
        self._ids = step_ids  # itertools.count: next() is atomic under the GIL
        self._local = self._global = NO_STEP

    def _id(self, step_id: int) -> int:
        return self._global if step_id == self._local and step_id != NO_STEP else step_id

    def on_step_begin(self, event: StepBegin) -> None:
        self._local, self._global = event.step_id, next(self._ids)
        self.inner.on_step_begin(event._replace(step_id=self._global))

    def on_request(self, event: RequestEvent) -> None:
        self.inner.on_request(event._replace(step_id=self._id(event.step_id)))

    def on_phase(self, event: PhaseEvent) -> None:
        self.inner.on_phase(event._replace(step_id=self._id(event.step_id)))

    def on_step(self, event: StepEvent) -> None:
        self.inner.on_step(event._replace(step_id=self._id(event.step_id)))

    def on_close(self) -> None:
        self.inner.on_close()


class ReplicaSink:
    """The load client's sink for a replicated run: client events as any run records
    them, each request's row from the recorder of the replica that served it."""

    def __init__(self, recorders: list[RunRecorder], unrouted: RunRecorder) -> None:
        self.recorders, self._unrouted = recorders, unrouted
        self.replica_of: dict[str, int] = {}

    def on_route(self, request_id: str, replica: int) -> None:
        self.replica_of[request_id] = replica

    def client_event(self, request_id: str, kind: str, ts_ns: int, num_tokens: int | None) -> None:
        self._unrouted.client_event(request_id, kind, ts_ns, num_tokens)

    def request_done(self, result: ClientResult) -> None:
        i = self.replica_of.get(result.request.request_id)
        (self._unrouted if i is None else self.recorders[i]).request_done(result)


def attach(
    engines: list, make_recorder: Callable[[int | None], RunRecorder], wrap=None
) -> ReplicaSink:
    """Give each engine its replica's observer (`wrap`: the run's faults around it) and
    return the client sink. `make_recorder(i)` builds replica i's recorder (None: the
    recorder of rows no replica owns)."""
    ids = itertools.count()
    recorders = [make_recorder(i) for i in range(len(engines))]
    for engine, recorder in zip(engines, recorders, strict=True):
        observer = ReplicaObserver(recorder, ids)
        engine.observer = wrap(observer) if wrap is not None else observer
    return ReplicaSink(recorders, make_recorder(None))


def check_supported(options) -> None:
    """What `--dp` does not combine with (yet; --tp is refused by EngineOptions),
    refused before anything is recorded."""
    if options.engine.dp > 1 and options.probes.profile_steps is not None:
        raise ConfigError("--profile-steps cannot follow several replicas' stepping threads "
                          "at once: drop it or use --dp 1")  # fmt: skip


@contextlib.contextmanager
def torch_threads(replicas: int) -> Iterator[int]:
    """Split torch's intra-op threads between the replicas' stepping threads (each
    replica's forwards run on its own thread, with this many helpers): the replicas
    together use the cores once, instead of each of them all. Restored afterwards."""
    import torch

    before = torch.get_num_threads()
    share = max(1, machine_cores() // replicas)
    torch.set_num_threads(share)
    try:
        yield share
    finally:
        torch.set_num_threads(before)
