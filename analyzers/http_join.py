"""A load client's run joined with the run of the server it drove (`perfdiag serve`), per
request by `x-request-id`: where the client-measured TTFT went.

Two processes, two monotonic clocks. Both manifests pair their clock with wall time,
which gives a first offset; each request's HTTP round trip refines it NTP-style: with the
client's send t1, the server's receipt t2, the server's response start t3 and the client's
receipt of the headers t4, offset = ((t2 − t1) + (t3 − t4)) / 2 and the round trip's
unexplained delay (t4 − t1) − (t3 − t2) bounds its error (± half of it). The request with
the tightest round trip wins.

Milestones, in the client's clock, each gating the next (so the parts add up exactly to
created → first token, i.e. client wait + the client's TTFT):

| part | from → to |
|---|---|
| client_wait_s | created → sent (a due request waiting for a slot under a concurrency cap) |
| connect_send_s | sent → server receipt: pool, connect, request write, network, HTTP parse |
| server_input_s | receipt → engine tokenize_end: body, validation, tokenisation, hand-off |
| server_queue_s | tokenize_end → admitted by the scheduler |
| prefill_s | admitted → first token sampled (prefill steps, other requests' work too) |
| stream_out_s | sampled → the client has it: detokenise, SSE write, network, client parse |

`connect_send_s` splits into `send_client_s` (sent → the client's last request byte) and
`network_in_s`; `stream_out_s` into `stream_server_s` (sampled → first chunk written) and
`network_out_s`. Pure pandas: no torch, no aiohttp.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..traces.reader import Run
from .lifecycle import Missing

PARTS = ("client_wait_s", "connect_send_s", "server_input_s", "server_queue_s", "prefill_s",
         "stream_out_s")  # fmt: skip
CLIENT_KINDS = ("created", "sent", "http_request_sent", "http_response_start", "first_token")
SERVER_KINDS = ("http_received", "response_start", "sse_chunk")
ENGINE_KINDS = ("tokenize_end", "scheduled", "first_token")


@dataclass(frozen=True)
class ClockAlignment:
    offset_ns: int  # server clock − client clock: t_server = t_client + offset_ns
    uncertainty_ns: int  # ± bound of the offset (half the tightest round trip's delay)
    method: str  # round-trip | manifest (same host, confirmed by round trips) | manifest-only
    manifest_offset_ns: int  # from the two manifests' clock origins
    samples: int  # requests with a complete round trip


@dataclass(frozen=True)
class HttpJoin:
    clock: ClockAlignment
    matched: int  # requests in both runs
    client_only: int  # sent by the client, never seen by the server (connection failures)
    server_only: int  # seen by the server only (probes, other clients)
    per_request: pd.DataFrame  # request_id, ttft_s, total_s, PARTS, sub-parts
    summary: pd.DataFrame  # part, mean_s, p50_s, p99_s, share (of the mean total)


def _first(events: pd.DataFrame, side: str, kinds: tuple[str, ...], pick: str = "min"):
    ev = events[(events["side"] == side) & events["kind"].isin(kinds)]
    if len(ev) == 0:
        return pd.DataFrame(columns=list(kinds), dtype="Int64")
    g = ev.groupby(["request_id", "kind"], observed=True)["ts_ns"]
    wide = getattr(g, pick)().unstack("kind")
    wide.index = wide.index.astype(str)
    return wide.reindex(columns=list(kinds)).astype("Int64")


def _manifest_offset(client: Run, server: Run) -> tuple[int, int | None]:
    """The offset the manifests' clock origins give, and its uncertainty when both runs
    come from one host (one wall clock); None across hosts, where the wall clocks' own
    disagreement is unknown."""
    c, s = client.manifest.clock, server.manifest.clock
    offset = (int(s["monotonic_ns"]) - int(s["wall_ns"])) - (
        int(c["monotonic_ns"]) - int(c["wall_ns"])
    )
    host = client.manifest.writer.get("host")
    if host is None or host != server.manifest.writer.get("host"):
        return offset, None
    return offset, int(c.get("uncertainty_ns", 0)) + int(s.get("uncertainty_ns", 0)) + 1


def align_clocks(client_ev: pd.DataFrame, server_ev: pd.DataFrame,
                 manifest: tuple[int, int | None]) -> ClockAlignment:  # fmt: skip
    """NTP-style offset from per-request round trips (both frames indexed by request). A
    same-host manifest offset inside the round trips' bound is tighter, and is used."""
    m_offset, m_bound = manifest
    both = client_ev.join(server_ev, how="inner")
    t1 = both["http_request_sent"].fillna(both["sent"])
    cols = [t1, both["http_received"], both["response_start"], both["http_response_start"]]
    ok = np.logical_and.reduce([c.notna().to_numpy() for c in cols])
    if not ok.any():
        return ClockAlignment(m_offset, m_bound or -1, "manifest-only", m_offset, 0)
    a1, a2, a3, a4 = (c.to_numpy(dtype="int64", na_value=0)[ok] for c in cols)
    delay = (a4 - a1) - (a3 - a2)  # int64 throughout: nanoseconds stay exact
    offset2 = (a2 - a1) + (a3 - a4)  # twice the offset
    best = int(np.argmin(np.where(delay >= 0, delay, np.iinfo(np.int64).max)))
    offset, bound = int(offset2[best] // 2), int(max(delay[best], 0) // 2 + 1)
    n = int(ok.sum())
    if m_bound is not None and m_bound < bound and abs(m_offset - offset) <= bound:
        return ClockAlignment(m_offset, m_bound, "manifest", m_offset, n)
    return ClockAlignment(offset, bound, "round-trip", m_offset, n)


def join_runs(client: Run, server: Run) -> HttpJoin | Missing:
    cev, sev = client.request_events, server.request_events
    if not (cev["side"] == "client").any():
        return Missing("http join", ("client run: request_events.client",))
    if not (sev["side"] == "server").any():
        return Missing("http join", ("server run: request_events.server",))
    c = _first(cev, "client", CLIENT_KINDS)
    c["http_request_sent"] = _first(cev, "client", ("http_request_sent",), "max")[
        "http_request_sent"
    ]  # the last request byte (body after headers)
    c = _as_server_ids(c, client.requests)
    s = _first(sev, "server", SERVER_KINDS)
    e = _first(sev, "engine", ENGINE_KINDS).add_prefix("engine_")
    server_all = s.join(e, how="outer")
    clock = align_clocks(c, server_all, _manifest_offset(client, server))
    matched = c.index.intersection(server_all.index)
    ids = matched[c.loc[matched, "first_token"].notna().to_numpy()
                  & server_all.loc[matched, "engine_first_token"].notna().to_numpy()]  # fmt: skip
    origin = int(c["created"].min()) if len(c) else 0

    def client_t(col: str) -> np.ndarray:
        v = c.loc[ids, col].to_numpy(dtype="float64", na_value=np.nan)
        return v - origin

    def server_t(col: str) -> np.ndarray:  # into the client's clock, then relative
        raw = server_all.loc[ids, col]
        shifted = (raw - clock.offset_ns - origin).astype("Float64")
        return shifted.to_numpy(dtype="float64", na_value=np.nan)

    created, sent, first = client_t("created"), client_t("sent"), client_t("first_token")
    req_sent = client_t("http_request_sent")
    recv, tok = server_t("http_received"), server_t("engine_tokenize_end")
    sched, sampled = server_t("engine_scheduled"), server_t("engine_first_token")
    written = server_t("sse_chunk")
    req_sent = np.where(np.isnan(req_sent), sent, req_sent)
    written = np.where(np.isnan(written), sampled, written)
    per = pd.DataFrame({"request_id": pd.array(ids, dtype="string")})
    milestones = [created, sent, recv, tok, sched, sampled, first]
    for name, a, b in zip(PARTS, milestones, milestones[1:], strict=False):
        per[name] = (b - a) / 1e9
    per["send_client_s"] = (req_sent - sent) / 1e9
    per["network_in_s"] = (recv - req_sent) / 1e9
    per["stream_server_s"] = (written - sampled) / 1e9
    per["network_out_s"] = (first - written) / 1e9
    per["ttft_s"] = (first - sent) / 1e9  # the client's TTFT (sent → first token)
    per["total_s"] = (first - created) / 1e9
    return HttpJoin(clock, len(matched), len(c.index.difference(server_all.index)),
                    len(server_all.index.difference(c.index)), per,
                    _summary(per))  # fmt: skip


def _as_server_ids(c: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """Index the client's requests by the id the server echoed (`args.http`): a server
    renames an id already in flight, e.g. when two clients share it."""
    echoed = {}
    for rid, args in zip(requests["request_id"], requests["args"], strict=True):
        try:
            sid = json.loads(args).get("http", {}).get("server_request_id")
        except (TypeError, ValueError, AttributeError):
            continue
        if sid and sid != rid:
            echoed[str(rid)] = sid
    return c.rename(index=echoed) if echoed else c


def _summary(per: pd.DataFrame) -> pd.DataFrame:
    total = per["total_s"].mean() if len(per) else np.nan
    rows = []
    for part in (*PARTS, "total_s"):
        v = per[part].to_numpy(dtype="float64")
        have = len(v) > 0
        rows.append({
            "part": part,
            "mean_s": float(v.mean()) if have else np.nan,
            "p50_s": float(np.percentile(v, 50)) if have else np.nan,
            "p99_s": float(np.percentile(v, 99)) if have else np.nan,
            "share": float(v.mean() / total) if have and total > 0 else np.nan,
        })  # fmt: skip
    return pd.DataFrame(rows)


def client_health(run: Run) -> dict | Missing:
    """The load client's own health as its HTTP run recorded it (see probes/http_session):
    event-loop lag and CPU, and whether the client, not the server, was the bottleneck."""
    health = run.manifest.extra.get("client_health")
    if not isinstance(health, dict):
        return Missing("client health", ("manifest.client_health",))
    return health
