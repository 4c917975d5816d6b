"""A context-wide CUDA sync is on no stream: Kineto writes its stream as 4294967295 (−1
as uint32), which became an export track named "stream 4294967295"."""

from __future__ import annotations

import gzip
import json

from conftest import KINETO

TRACE = KINETO / "a100_alexnet_cuda_sync.json.gz"


def test_context_sync_is_on_no_stream(tmp_path, cli):
    run, out = tmp_path / "run", tmp_path / "trace.json.gz"
    assert cli("import", TRACE, "--out", run).returncode == 0
    r = cli("export", run, "--format", "chrome", "-o", out)
    assert r.returncode == 0, r.stderr
    events = json.loads(
        gzip.decompress(out.read_bytes()) if out.suffix == ".gz" else out.read_text()
    )
    events = events["traceEvents"] if isinstance(events, dict) else events
    names = {
        e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    assert not any("4294967295" in n for n in names)
    assert any(n.startswith("no stream (context-wide)") for n in names)
