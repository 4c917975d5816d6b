"""A server's own /metrics as evidence: the scrape's parsing (on a /metrics page recorded from
vLLM 0.32.0, the CPU build, serving SmolLM2-135M: tests/data/vllm/), deltas over the run,
histogram percentiles with their bucket resolution, and the server's settings."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from perfdiag.analyzers.server_metrics import Histogram, server_metrics, split_series
from perfdiag.analyzers.server_settings import ServerSettings
from perfdiag.probes.metrics_scrape import parse_exposition, series_name
from perfdiag.traces.reader import load_run
from perfdiag.traces.schema import Counter
from perfdiag.traces.writer import RunWriter

VLLM_PAGE = Path(__file__).parent / "data" / "vllm" / "metrics-vllm-0.32.0-cpu.txt"


def test_a_real_vllm_page_keeps_buckets_and_labels_that_separate_series():
    samples, info = parse_exposition(VLLM_PAGE.read_text())
    names = dict(samples)
    # model_name is dropped (one model), the data-parallel engine label is kept
    assert names["vllm:num_requests_running{engine=0}"] == 0.0
    assert names["vllm:prompt_tokens_total{engine=0}"] == 32.0
    assert "vllm:time_to_first_token_seconds_bucket{engine=0,le=+Inf}" in names
    assert names["vllm:num_requests_waiting_by_reason{engine=0,reason=capacity}"] == 0.0
    assert not any(n.endswith("_created") or "_created{" in n for n in names)
    # info metrics are facts, kept whole beside the samples, not as a counter
    cache = info["vllm:cache_config_info"]
    assert cache["block_size"] == "128" and cache["num_gpu_blocks"] == "364"
    assert not any(n.startswith("vllm:cache_config_info") for n in names)


def test_bad_text_gives_what_parsed_before_it():
    samples, _ = parse_exposition("ok_total 3\nthis is { not prometheus\n")
    assert samples == [("ok_total", 3.0)]
    assert parse_exposition("") == ([], {})


def test_series_names_round_trip():
    name = series_name("vllm:x_bucket", {"le": "0.5", "engine": "1", "model_name": "m"})
    assert name == "vllm:x_bucket{engine=1,le=0.5}"
    assert split_series(name) == ("vllm:x_bucket", {"engine": "1", "le": "0.5"})
    assert split_series("plain") == ("plain", {})


def test_histogram_quantile_is_linear_in_its_bucket_and_states_the_bucket():
    # 10 observations: 4 in (0, 0.1], 4 in (0.1, 0.5], 2 above 0.5 (+Inf)
    h = Histogram("x", 10, 3.0, (0.1, 0.5, math.inf), (4, 8, 10))
    assert h.mean == pytest.approx(0.3)
    est, lo, hi = h.quantile(0.5)  # rank 5: 1 of the 4 in (0.1, 0.5]
    assert (lo, hi) == (0.1, 0.5) and est == pytest.approx(0.1 + 0.4 / 4)
    est, lo, hi = h.quantile(0.99)  # in the +Inf bucket: its lower bound, unbounded above
    assert est == 0.5 and lo == 0.5 and math.isinf(hi)
    assert all(math.isnan(v) for v in Histogram("e", 0, 0, (), ()).quantile(0.5))


def _scrape_rows(text: str, ts: int, scale: float = 1.0):
    samples, _ = parse_exposition(text)
    return [Counter(n, ts, v * scale, "target") for n, v in samples]


def _two_scrape_run(tmp_path, config=None):
    """Two scrapes of the real page: at t=1 s everything as recorded, at t=5 s every
    counter and histogram tripled (so the deltas are twice the page's values)."""
    text = VLLM_PAGE.read_text()
    with RunWriter(tmp_path / "run", command=["t"], config=config or {},
                   environment_info={"test": True}) as w:  # fmt: skip
        w.table("counters").extend(_scrape_rows(text, 1_000_000_000))
        w.table("counters").extend(_scrape_rows(text, 5_000_000_000, 3.0))
        w.table("counters").append(Counter("client_loop_lag_max_s", 2_000_000_000, 0.0, "client"))
    return load_run(tmp_path / "run")


def test_deltas_between_the_scrapes_around_the_requests(tmp_path):
    run = _two_scrape_run(tmp_path)
    sm = server_metrics(run, 1_500_000_000, 4_000_000_000)
    assert sm.server == "vllm" and (sm.start_ns, sm.end_ns) == (1_000_000_000, 5_000_000_000)
    assert sm.counters["prompt_tokens"] == 64.0  # 3×32 − 32
    assert sm.counters["requests_finished"] == 8.0  # summed over finished_reason
    assert sm.counters["prefix_queries"] == 64.0 and sm.counters["prefix_hits"] == 0.0
    q = sm.histograms["queue_s"]
    assert q.count == 8.0 and q.name == "vllm:request_queue_time_seconds"
    ttft = sm.histograms["ttft_s"]
    assert ttft.mean == pytest.approx(0.4584674835205078 / 4)
    assert ttft.bounds[-1] == math.inf and ttft.cumulative[-1] == ttft.count
    assert sm.names["queue_s"] == "vllm:request_queue_time_seconds"
    assert "vllm:request_queue_time_seconds" in sm.source("queue_s")
    # gauges per scrape inside the window, summed over their series
    assert list(sm.gauge("running").index) == [1_000_000_000, 5_000_000_000]
    assert "waiting_capacity" in sm.gauges and "kv_usage" in sm.gauges
    # a concept the server does not export is absent, never zero
    assert "spec_draft_tokens" not in sm.counters and sm.gauge("max_running") is None


def test_a_run_without_server_scrapes_has_no_server_metrics(tmp_path):
    with RunWriter(tmp_path / "r", command=["t"], config={}, environment_info={}) as w:
        w.table("counters").append(Counter("client_loop_lag_max_s", 1, 0.0, "client"))
    assert server_metrics(load_run(tmp_path / "r"), 0, 10) is None


def test_settings_come_from_the_launch_then_the_servers_info():
    cache_info = {"block_size": "128", "num_gpu_blocks": "364", "enable_prefix_caching": "True"}
    launch = {
        "args": {"max_num_seqs": 2, "enable_prefix_caching": False},
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
    }
    info = {"vllm:cache_config_info": cache_info}
    config = {"server": {"kind": "vllm", "launch": launch, "info": info}}
    s = ServerSettings.of(config)
    assert s.get("max_num_seqs") == 2 and s.source("max_num_seqs") == "launch arguments"
    assert s.get("block_size") == 128 and s.source("block_size") == "the server's info metrics"
    assert s.get("enable_prefix_caching") is False  # the launch wins over the info metric
    assert s.get("max_num_batched_tokens") is None  # not stated: never a guessed default
    assert s.knob("max_num_seqs") == "--max-num-seqs"
    assert s.kv_knob(on_gpu=False).startswith("VLLM_CPU_KVCACHE_SPACE")
    sglang = ServerSettings.of({"server": {"kind": "sglang"}})
    assert sglang.knob("max_num_seqs") == "--max-running-requests"
    assert ServerSettings.of({}).kind == "unknown"


SGLANG_PAGE = """\
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} %(running)s
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} %(waiting)s
# TYPE sglang:max_running_requests gauge
sglang:max_running_requests{model_name="m"} 8.0
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m"} %(prompt)s
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_sum{model_name="m"} %(ttft_sum)s
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} %(le01)s
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} %(n)s
sglang:time_to_first_token_seconds_count{model_name="m"} %(n)s
"""


def test_sglang_names_read_as_the_same_concepts(tmp_path):
    before = SGLANG_PAGE % dict(running=0, waiting=0, prompt=0, ttft_sum=0, le01=0, n=0)
    after = SGLANG_PAGE % dict(running=8, waiting=5, prompt=640, ttft_sum=2.0, le01=4, n=10)
    with RunWriter(tmp_path / "r", command=["t"], config={}, environment_info={}) as w:
        w.table("counters").extend(_scrape_rows(before, 1_000))
        w.table("counters").extend(_scrape_rows(after, 2_000))
    sm = server_metrics(load_run(tmp_path / "r"), 1_000, 2_000)
    assert sm.server == "sglang"
    assert sm.counters["prompt_tokens"] == 640.0
    assert sm.histograms["ttft_s"].mean == pytest.approx(0.2)
    assert sm.histograms["ttft_s"].quantile(0.3)[1:] == (0.0, 0.1)  # within its bucket
    assert sm.gauge("running").max() == 8 and sm.gauge("waiting").max() == 5
    assert sm.gauge("max_running").max() == 8  # SGLang states its cap
    assert "queue_s" not in sm.histograms  # not exported here: absent, not zero
