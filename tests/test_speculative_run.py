"""`perfdiag run --speculative`: a readable run whose records follow the format the
analysis reads (config in the manifest, draft phases, spec_* counters per verified
request at its step's start), and a one-line error for a bad value."""

from __future__ import annotations

import pytest

from perfdiag import load_run

TINY = ["--preset", "tiny", "--kv-cache-mb", "4", "-q", "--no-device-sampling",
        "--requests", "8", "--warmup", "0", "--prompt-len", "uniform:8:32",
        "--output-len", "uniform:16:32"]  # fmt: skip


@pytest.mark.parametrize("value", ["ngram", "ngram:0", "ngram:17", "ngram:x", "beam:4",
                                   "draft:4", "ngram:tiny:4", "draft:no-such-model:2"])  # fmt: skip
def test_bad_value_is_one_line(cli, tmp_path, value):
    out = tmp_path / "run"
    result = cli("run", *TINY, "--speculative", value, "--out", out)
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("perfdiag: error: "), result.stderr
    assert "speculative" in lines[0] or "draft model" in lines[0], lines[0]
    assert not out.exists()


def test_ngram_run_is_recorded(cli, tmp_path):
    out = tmp_path / "run"
    result = cli("run", *TINY, "--speculative", "ngram:4", "--out", out)
    assert result.returncode == 0, result.stderr
    run = load_run(out)
    spec = run.manifest.config["engine_config"]["speculative"]
    assert spec == {"method": "ngram", "num_tokens": 4, "draft": None}
    spans = run.spans
    draft_steps = set(spans.loc[spans["name"] == "draft", "step_id"])
    assert draft_steps
    c = run.counters
    c = c[c["name"].str.startswith("spec_")]
    assert set(c["name"]) == {"spec_drafted", "spec_accepted", "spec_emitted"}
    wide = c.pivot_table(index=["ts_ns", "scope"], columns="name", values="value")
    assert (wide["spec_accepted"] <= wide["spec_drafted"]).all()
    assert (wide["spec_emitted"] <= wide["spec_accepted"] + 1).all()
    step_of = run.steps.set_index("start_ns")["step_id"]
    rows = wide.reset_index()
    rows["step_id"] = step_of.loc[rows["ts_ns"]].to_numpy()  # each row at its step's start
    assert set(rows["step_id"]) <= draft_steps
    # Each output token is a TOKEN event: a verified step's tokens are its spec_emitted,
    # any other step of the request emitted exactly one.
    ev = run.request_events
    tokens = ev[(ev["side"] == "engine") & ev["kind"].isin(["first_token", "token"])]
    per_step = tokens.groupby(["request_id", "step_id"]).size()
    verified = rows.set_index(["scope", "step_id"])["spec_emitted"]
    for key, n in per_step.items():
        assert n == (verified.get(key, 1)), key
    assert set(verified.index) <= set(per_step.index)


def test_serve_refuses_a_bad_value_in_one_line(cli):
    result = cli("serve", "--preset", "tiny", "--no-record", "--speculative", "draft:tiny")
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert lines == ["perfdiag: error: bad --speculative 'draft:tiny': use ngram:K or "
                     "draft:PRESET_OR_FILE:K with K in 1..16"]  # fmt: skip
