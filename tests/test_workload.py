"""Workload specs and plans: reproducible, validated, and shaped as specified."""

import json

import numpy as np
import pytest

from perfdiag.errors import ConfigError
from perfdiag.probes.workload import (
    ArrivalSpec,
    CancelSpec,
    LengthSpec,
    PrefixSpec,
    WorkloadSpec,
    plan,
)
from perfdiag.probes.workload_library import builtins, load_workload, override

VOCAB = 259


def test_same_seed_same_plan_and_another_seed_differs():
    spec = load_workload("chat")
    assert list(plan(spec, VOCAB)) == list(plan(spec, VOCAB))
    other = list(plan(override(spec, seed=1), VOCAB))
    assert [r.prompt_ids for r in other] != [r.prompt_ids for r in list(plan(spec, VOCAB))]


def test_changing_the_rate_keeps_the_prompts():
    spec = load_workload("chat")
    a, b = list(plan(spec, VOCAB)), list(plan(override(spec, rate=8.0), VOCAB))
    assert [r.prompt_ids for r in a] == [r.prompt_ids for r in b]
    assert b[-1].offset_s < a[-1].offset_s


@pytest.mark.parametrize("name", sorted(builtins()))
def test_every_builtin_plans(name):
    spec = load_workload(name)
    planned = list(plan(spec, VOCAB))
    assert len(planned) == spec.requests
    assert sum(r.is_warmup for r in planned) == spec.warmup
    assert all(r.is_warmup for r in planned[: spec.warmup])


def test_open_loop_offsets_follow_the_rate():
    n = 4000
    for process in ("constant", "poisson", "gamma"):
        arrival = ArrivalSpec(mode="open", rate=50.0, process=process, burstiness=0.5)
        offsets = [r.offset_s for r in list(plan(WorkloadSpec(requests=n, arrival=arrival), VOCAB))]
        assert offsets[0] == 0.0 and np.all(np.diff(offsets) >= 0)
        rate = (n - 1) / offsets[-1]
        assert rate == pytest.approx(50.0, rel=0.06), process
    gaps = np.diff([r.offset_s for r in list(plan(
        WorkloadSpec(requests=n, arrival=ArrivalSpec(mode="open", rate=50.0, process="gamma",
                                                     burstiness=0.25)), VOCAB))])  # fmt: skip
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(2.0, rel=0.15)  # CV = 1/sqrt(shape)


def test_lengths_distributions():
    rng = np.random.default_rng(0)
    assert set(LengthSpec.parse("7").sample(rng, 50)) == {7}
    u = LengthSpec.parse("uniform:3:9").sample(rng, 5000)
    assert u.min() == 3 and u.max() == 9
    lg = LengthSpec.parse("lognormal:100:1.0:10:2000").sample(rng, 20000)
    assert np.median(lg) == pytest.approx(100, rel=0.08)
    assert lg.min() >= 10 and lg.max() <= 2000 and np.percentile(lg, 99) > 500  # long tail


def test_shared_prefix_groups_share_tokens_and_skew_makes_hot_groups():
    spec = WorkloadSpec(requests=2000, shared_prefix=PrefixSpec(groups=8, length=16, skew=1.5))
    planned = list(plan(spec, VOCAB))
    by_group = {}
    for r in planned:
        by_group.setdefault(r.prefix_group, set()).add(r.prompt_ids[:16])
    assert all(len(prefixes) == 1 for prefixes in by_group.values())
    counts = np.bincount([r.prefix_group for r in planned], minlength=8)
    assert counts[0] > 4 * counts[7]  # group 0 is hot, group 7 cold


def test_cancellation_fraction_is_exact():
    spec = WorkloadSpec(requests=200, cancel=CancelSpec(fraction=0.25, after_tokens=3))
    planned = list(plan(spec, VOCAB))
    assert sum(r.cancel_after_tokens == 3 for r in planned) == 50


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: WorkloadSpec(requests=0), "1 to 1,000,000,000 requests"),
        (lambda: WorkloadSpec(warmup=5, requests=5), "warmup"),
        (lambda: ArrivalSpec(mode="open"), r"needs a rate in \(0, "),
        (lambda: ArrivalSpec(mode="closed", concurrency=0), "concurrency >= 1"),
        (lambda: CancelSpec(fraction=0.5), "after_tokens or after_s"),
        (lambda: PrefixSpec(groups=0), "groups"),
    ],
)
def test_invalid_specs(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


def test_bad_length_text():
    with pytest.raises(ConfigError, match="bad length"):
        LengthSpec.parse("zipf:3")


def test_unknown_workload_and_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="unknown workload 'nope'"):
        load_workload("nope")
    bad = tmp_path / "w.yaml"
    bad.write_text("requests: [1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_workload(str(bad))
    bad.write_text("requests: 3\ncolour: blue\n")
    with pytest.raises(ConfigError, match="unknown workload keys: colour"):
        load_workload(str(bad))


def test_yaml_workload_file(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text(
        "requests: 10\narrival: {mode: open, rate: 5, process: constant, concurrency: 2}\n"
        "prompt_len: uniform:4:8\noutput_len: 3\ncancel: {fraction: 0.1, after_s: 0.5}\n"
    )
    spec = load_workload(str(f))
    assert spec.name == "mine" and spec.arrival.concurrency == 2
    planned = list(plan(spec, VOCAB))
    assert [r.offset_s for r in planned][:3] == pytest.approx([0.0, 0.2, 0.4])
    assert sum(r.cancel_after_s == 0.5 for r in planned) == 1


def test_replay_with_timestamps(tmp_path):
    f = tmp_path / "r.jsonl"
    lines = [
        {"prompt_ids": [1, 2, 3], "max_tokens": 4, "timestamp_s": 10.0},
        {"prompt_tokens": 5, "output_tokens": 2, "timestamp_s": 10.5},
        {"prompt": "hello", "max_tokens": 1, "timestamp_s": 12.0},
    ]
    f.write_text("\n".join(json.dumps(x) for x in lines))
    spec = WorkloadSpec(replay=str(f), replay_timestamps=True, requests=100)
    planned = list(plan(spec, VOCAB))
    assert [r.offset_s for r in planned] == [0.0, 0.5, 2.0]
    assert planned[0].prompt_ids == (1, 2, 3) and planned[1].prompt_len == 5
    assert planned[2].prompt_text == "hello" and planned[2].max_tokens == 1


def test_replay_errors_name_the_line(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text('{"prompt_ids": [1], "max_tokens": 2}\n{"max_tokens": 2}\n')
    with pytest.raises(ConfigError, match=r"r\.jsonl:2: give prompt"):
        list(plan(WorkloadSpec(replay=str(f)), VOCAB))
