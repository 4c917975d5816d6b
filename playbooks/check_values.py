"""What each fact's value measures, and in which unit: how a check's outcome reads.

A finding's title says what fired; a check that passed (or fired) also has a value, the
fact's number compared with the check's thresholds. Read bare, `0.00453` says nothing;
with its meaning and unit it reads "TTFT growth per second of load 0.00453 s/s (fires at
≥ 0.1 s/s)". The meaning may name the check's parameters (`{part}`, `{cause}`, `{what}`),
spelled out by PARAM_WORDS. A test checks that every registered fact has an entry.
"""

from __future__ import annotations

from typing import NamedTuple


class Measure(NamedTuple):
    label: str  # what the value is, as a noun phrase ("requests measured")
    unit: str = ""  # an Evidence unit: "%" for shares, "ms", "s/s", "×", "" for counts/text


FACT_MEASURES: dict[str, Measure] = {
    # the gate (step 0)
    "run_status": Measure("run status"),
    "dropped_records": Measure("records dropped", "%"),
    "profiler_window_empty": Measure("profiler window empty"),
    "probe_stalls": Measure("engine time held by probes", "%"),
    "client_stalls": Measure("TTFT or ITL p99 that is the load client's own stalls", "%"),
    "clock_uncertainty_ms": Measure("clock uncertainty", "ms"),
    "out_of_order": Measure("requests and steps out of order", "%"),
    "incomplete_lifecycles": Measure("requests with incomplete lifecycles", "%"),
    "unexplained_latency": Measure("TTFT or ITL unexplained", "%"),
    "missing_tables": Measure("tables without rows"),
    "missing_parts": Measure("parts of the run that never arrived"),
    "lost_rows": Measure("recorded rows whose table file is missing"),
    # step 1
    "unpinned": Measure("unrecorded things a reproduction needs"),
    "repeat_spread": Measure("largest spread across repeats", "%"),
    "repeat_differences": Measure("settings that differ between repeats"),
    "measured_requests": Measure("requests measured"),
    # step 2
    "back_pressure": Measure("requests held back by the client's cap", "%"),
    "wait_growth": Measure("TTFT growth per second of load", "s/s"),
    "client_behind_schedule": Measure("issued rate below the client's plan", "%"),
    "serial_server": Measure("TTFT spent behind other requests' streams", "%"),
    "sent_below_plan": Measure("sent rate below the client's plan", "%"),
    "burst_queueing": Measure("TTFT queued because of bursts", "%"),
    "schedule_vs_target": Measure("drawn schedule's rate off the target", "%"),
    "littles_law_gap": Measure("Little's law gap beyond the window's edges", "%"),
    # step 3
    "ttft_part_share": Measure("TTFT in {part}", "%"),
    "ttft_overhead": Measure("TTFT that is not the request's own prefill", "%"),
    "cold_starvation": Measure("cold-prefix TTFT waiting beyond hot-prefix requests", "%"),
    "chunk_overhead": Measure("TTFT in step cost and gaps beyond the first prefill step", "%"),
    "itl_spike": Measure("worst 1 % of ITL over the median", "×"),
    "itl_tail_share": Measure("ITL spikes from {cause}", "%"),
    "server_ttft_parts": Measure("TTFT queued in the server (its own record)", "%"),
    "server_seq_cap": Measure("TTFT queued while the server ran at its sequence cap", "%"),
    "server_budget_slicing": Measure("TTFT in the extra steps the token budget adds", "%"),
    # step 4
    "host_contention": Measure("step time lost to other processes", "%"),
    "step_inflation": Measure("step time beyond the step cost model", "%"),
    "host_share": Measure("engine busy time on the host", "%"),
    "overlap_off": Measure("step time scheduling and preparing in line", "%"),
    "preemption_rate": Measure("preemptions per request"),
    "kv_full_share": Measure("steps waiting on a full KV pool", "%"),
    "server_kv_pressure": Measure("preemptions per request (the server's counter)"),
    "critical_path": Measure("traced time the biggest lever on the critical path would save", "%"),
    "gpu_idle_share": Measure("traced time the GPU idles {cause}", "%"),
    "exposed_share": Measure("traced time in {what} without compute beside it", "%"),
    "rank_imbalance": Measure("less work on the idlest rank than the busiest", "%"),
    "ranks": Measure("ranks"),
    "comm_share": Measure("step time in collectives with every rank in", "%"),
    "collective_wait": Measure("step time lost waiting for the late rank", "%"),
    "tp_scaling": Measure("speed per computed token against the baseline", "×"),
    "pp_bubbles": Measure("stage time idle in the pipeline's fill and drain", "%"),
    "pp_stage_imbalance": Measure("slowest stage's time the others sit idle", "%"),
    "pp_scaling": Measure("output tokens/s against the baseline's layout", "×"),
    "expert_imbalance": Measure("step time lost waiting for the rank with the hot experts", "%"),
    "dp_imbalance": Measure("run time the busiest replica spent beyond an even share", "%"),
    "kv_quant_tradeoff": Measure("preemptions per request or steps waiting on a full pool", "%"),
    "spec_no_speedup": Measure("throughput speculative decoding lost against none", "%"),
    "spec_k_gain": Measure("throughput the best draft length K would add", "%"),
    "spec_acceptance": Measure("draft tokens accepted", "%"),
    # step 5
    "prefix_reuse_missed": Measure("prompt tokens recomputed that the cache could serve", "%"),
    "cache_hits": Measure("prompt tokens served by the prefix cache", "%"),
    "offload_restore_slower": Measure("host-tier restore time recomputing would have saved", "%"),
    "offload_thrash": Measure("blocks written to the host tier and evicted unused", "%"),
    # steps 6 and 7
    "changed_variables": Measure("main variables changed"),
    "failure_rate": Measure("requests failed", "%"),
    "slo_attainment": Measure("requests that met the SLO", "%"),
    "output_mismatch": Measure("requests whose outputs differ", "%"),
    "latency_regression": Measure("largest latency worsening beyond noise", "%"),
}

PARAM_WORDS = {
    # TTFT parts (analyzers/ttft.py)
    "input_s": "input processing",
    "queue_s": "the engine queue",
    "cache_load_s": "cache loads",
    "prefill_own_s": "its own prefill",
    "step_overhead_s": "fixed step cost",
    "prefill_others_s": "others' work",
    "inflation_s": "inflated steps",
    "probe_s": "probe stalls",
    "host_gap_s": "gaps between steps",
    "sample_return_s": "sampling and return",
    "remainder_s": "no milestone",
    # ITL causes (analyzers/itl.py)
    "decode": "decode",
    "interference": "others' prefill",
    "inflation": "inflated steps",
    "preemption": "preemption",
    "probe": "probe stalls",
    "host_gap": "gaps between steps",
    "stream_out": "delivery after sampling",
    "remainder": "no step",
    # GPU gap causes (analyzers/gaps.py)
    "sync": "in synchronisation",
    "launch_delay": "for late launches",
    "host_bound": "for a busy host",
    "no_work": "with no work",
    "dependency": "waiting on a dependency",
    "unexplained": "for no cause the trace shows",
    "unlinked": "for unknown reasons",
    # exposed work
    "comm": "communication",
    "copy": "copies",
}


def measure(fact: str, params: dict) -> Measure:
    """The meaning and unit of `fact`'s value under the check's `params`."""
    m = FACT_MEASURES.get(fact, Measure(fact.replace("_", " ")))
    words = {k: PARAM_WORDS.get(str(v), str(v).replace("_", " ")) for k, v in params.items()}
    for key in ("part", "cause", "what"):
        words.setdefault(key, "")
    return Measure(m.label.format_map(words).replace("  ", " "), m.unit)
