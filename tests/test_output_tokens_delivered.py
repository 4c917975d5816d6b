"""requests.output_tokens is the tokens the client received, which on a dropped stream
is fewer than the engine sampled: every place that shows the number says which."""

from __future__ import annotations

import re
from pathlib import Path

import serving_runs as runs
from fuzz_support import call_cli

ROOT = Path(__file__).resolve().parent.parent


def test_the_run_format_and_the_schema_say_delivered_not_sampled():
    doc = (ROOT / "docs" / "run-format.md").read_text()
    requests = doc[doc.index("- **requests**") : doc.index("- **request_events**")]
    assert re.search(r"`output_tokens` counts the tokens\s+\*\*delivered\*\*", requests)
    assert "sampled" in requests
    schema = (ROOT / "traces" / "schema.py").read_text()
    comment = schema[schema.index("class Request(") : schema.index("output_tokens: int")]
    assert "delivered to the client" in comment and "sampled" in comment


def test_analyze_labels_the_throughput_as_delivered(tmp_path):
    run = runs.basic(tmp_path / "run")
    outcome = call_cli("analyze", run, "--no-report", "--details")
    assert outcome.code == 0, outcome.stderr
    assert "output tokens/s (delivered)" in outcome.stdout
    assert not re.search(r"output tokens/s(?! \(delivered\))", outcome.stdout.replace(
        "goodput output tokens/s", ""))  # fmt: skip
