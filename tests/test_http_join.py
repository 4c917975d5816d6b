"""Client and server runs joined per request: clocks aligned, TTFT split into parts that
sum to what the client measured."""

from __future__ import annotations

import json

import numpy as np
import pytest

from perfdiag.analyzers.http_join import PARTS, align_clocks, join_runs
from perfdiag.analyzers.lifecycle import build_lifecycle
from perfdiag.engine_ref import LLMEngine
from perfdiag.engine_ref.server import ServerConfig, ServerThread
from perfdiag.engine_ref.testing import tiny_config
from perfdiag.probes.http_session import HttpOptions, record_http_run
from perfdiag.probes.run_options import ProbeOptions, RunOptions
from perfdiag.probes.server_probe import ServerRun
from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec
from perfdiag.traces.reader import load_run
from perfdiag.traces.schema import Request, RequestEvent
from perfdiag.traces.writer import RunWriter


@pytest.fixture(scope="module")
def joined_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("join")
    engine = LLMEngine(tiny_config())
    config = ServerConfig(port=0)
    run = ServerRun(tmp / "srv", engine, config, device_sampling=False)
    with ServerThread(engine, config, run.recorder, run.run_id) as srv:
        spec = WorkloadSpec(requests=16, arrival=ArrivalSpec(mode="open", rate=80.0,
                                                             concurrency=4),
                            prompt_len=LengthSpec(value=40),
                            output_len=LengthSpec(value=8))  # fmt: skip
        options = RunOptions(workload=spec, probes=ProbeOptions(device_sampling=False))
        record_http_run(options, tmp / "cli", http=HttpOptions(url=srv.url, scrape_period_s=0.1))
    run.close("complete")
    return load_run(tmp / "cli"), load_run(tmp / "srv")


def test_parts_sum_to_the_client_measured_ttft(joined_runs):
    client, server = joined_runs
    j = join_runs(client, server)
    assert j.matched == 16 and j.client_only == 0 and j.server_only == 1  # the probe
    per = j.per_request.set_index("request_id")
    # The client's own view, computed by the serving analyzers from the client run alone.
    lc = build_lifecycle(client).requests.set_index("request_id")
    measured = (lc["t_first"] - lc["t_created"]) / 1e9
    summed = per[list(PARTS)].sum(axis=1)
    rel = (summed - measured.loc[per.index]).abs() / measured.loc[per.index]
    assert (rel < 0.02).all(), rel.max()
    ttft = (lc["t_first"] - lc["t_sent"]) / 1e9
    assert np.allclose(per["ttft_s"], ttft.loc[per.index], rtol=1e-9)
    # Aligned clocks put every milestone after the one before, within the offset's bound.
    slack = j.clock.uncertainty_ns / 1e9 + 1e-6
    assert (per[list(PARTS)] >= -slack).all().all()
    assert (per["prefill_s"] > 0).all() and (per["connect_send_s"] > 0).all()
    # Sub-parts split their part exactly.
    assert np.allclose(per["send_client_s"] + per["network_in_s"], per["connect_send_s"])
    assert np.allclose(per["stream_server_s"] + per["network_out_s"], per["stream_out_s"])
    # One host, one monotonic clock: the offset is ~0, confirmed by the round trips.
    assert j.clock.samples >= 16 and abs(j.clock.offset_ns) <= j.clock.uncertainty_ns + 1000
    assert abs(j.summary.set_index("part").loc["total_s", "share"] - 1.0) < 1e-9
    # The client recorded its own health and the server's metrics.
    assert "client_bound" in client.manifest.extra["client_health"]
    scopes = set(client.counters["scope"].astype(str))
    assert {"client", "target"} <= scopes
    assert client.manifest.config["target"]["perfdiag_run"] == server.manifest.run_id


def test_prefill_part_matches_the_server_alone(joined_runs):
    client, server = joined_runs
    per = join_runs(client, server).per_request.set_index("request_id")
    ev = server.request_events
    eng = ev[ev["side"] == "engine"]
    sched = eng[eng["kind"] == "scheduled"].groupby("request_id", observed=True)["ts_ns"].min()
    first = eng[eng["kind"] == "first_token"].groupby("request_id", observed=True)["ts_ns"].min()
    own = ((first - sched) / 1e9).loc[per.index]
    assert np.allclose(per["prefill_s"], own, atol=1e-9)


def _write(path, events, requests=()):
    with RunWriter(path, command=["test"]) as w:
        for e in events:
            w.table("request_events").append(e)
        for r in requests:
            w.table("requests").append(r)


def test_round_trips_recover_a_clock_offset_the_manifests_do_not_know(tmp_path):
    """A server whose monotonic clock runs 3 s ahead (another host, say): the round trips
    find the offset to within their bound, and the decomposition still adds up."""
    offset = 3_000_000_000
    client_ev, server_ev = [], []
    for i in range(5):
        rid, t = f"r{i}", 10_000_000_000 + i * 50_000_000
        delay_in, delay_out = 200_000 + i * 10_000, 150_000 + i * 20_000  # one way, ns
        client_ev += [RequestEvent(rid, "created", t, "client"),
                      RequestEvent(rid, "sent", t + 1000, "client"),
                      RequestEvent(rid, "http_request_sent", t + 50_000, "client")]  # fmt: skip
        recv = t + 50_000 + delay_in
        start = recv + 300_000
        client_ev += [
            RequestEvent(rid, "http_response_start", start + delay_out, "client"),
            RequestEvent(rid, "first_token", start + 5_000_000 + delay_out, "client"),
            RequestEvent(rid, "chunk", start + 5_000_000 + delay_out, "client", None, 1),
        ]
        server_ev += [RequestEvent(rid, "http_received", recv + offset, "server"),
                      RequestEvent(rid, "tokenize_end", recv + 100_000 + offset, "engine"),
                      RequestEvent(rid, "response_start", start + offset, "server"),
                      RequestEvent(rid, "scheduled", start + 1_000_000 + offset, "engine", 1),
                      RequestEvent(rid, "first_token", start + 4_900_000 + offset, "engine", 2),
                      RequestEvent(rid, "sse_chunk", start + 4_950_000 + offset,
                                   "server")]  # fmt: skip
    # the server renamed r0 (an id already in flight); the client noted what it echoed
    server_ev = [e._replace(request_id="r0-x1") if e.request_id == "r0" else e
                 for e in server_ev]  # fmt: skip
    echoed = Request("r0", args=json.dumps({"http": {"server_request_id": "r0-x1"}}))
    _write(tmp_path / "c", client_ev, [echoed])
    _write(tmp_path / "s", server_ev)
    j = join_runs(load_run(tmp_path / "c"), load_run(tmp_path / "s"))
    assert (j.matched, j.client_only, j.server_only) == (5, 0, 0)
    assert j.clock.method == "round-trip"
    # the tightest round trip is r0: asymmetry 50 µs → the estimate is off by 25 µs
    assert abs(j.clock.offset_ns - offset) <= j.clock.uncertainty_ns
    assert abs(j.clock.offset_ns - offset) == 25_000
    per = j.per_request.set_index("request_id")
    assert np.allclose(per[list(PARTS)].sum(axis=1), per["total_s"])
    assert np.allclose(per["server_queue_s"], 0.0012)  # tokenize_end → scheduled, one clock
    assert np.allclose(per["prefill_s"], 0.0039)


def test_align_clocks_without_round_trips_falls_back_to_the_manifests():
    import pandas as pd

    empty = pd.DataFrame(columns=["sent", "http_request_sent", "http_response_start"],
                         dtype="Int64")  # fmt: skip
    server = pd.DataFrame(columns=["http_received", "response_start"], dtype="Int64")
    c = align_clocks(empty, server, (123, None))
    assert (c.offset_ns, c.method, c.samples) == (123, "manifest-only", 0)
