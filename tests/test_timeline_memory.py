"""What `perfdiag timeline` keeps in memory (issue 36: its peak was 0.84x HTA's at 412k
events): the roofline reads the few span columns it needs instead of caching the whole
spans table (args and all) on the run while the critical path runs; the gap evidence
turns only the synchronisations' names into text, not every span's."""

from pathlib import Path

import pandas as pd
import pytest

from perfdiag.analyzers.roofline import roofline_report
from perfdiag.traces.reader import load_run

KINETO = Path(__file__).resolve().parent / "data" / "kineto"


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    from typer.testing import CliRunner

    from perfdiag.cli import app

    out = tmp_path_factory.mktemp("memory") / "run"
    trace = KINETO / "a100_alexnet_cuda_sync.json.gz"
    result = CliRunner().invoke(app, ["import", str(trace), "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_the_roofline_does_not_cache_the_spans_table(imported):
    run = load_run(imported)
    roof = roofline_report(run)
    assert roof.ceilings.device  # it did judge the run
    assert "spans" not in run._frames  # the whole table (args included) stays unread


def test_host_syncs_converts_only_the_syncs_names(imported, monkeypatch):
    from perfdiag.analyzers import gap_evidence
    from perfdiag.analyzers.gaps import _SYNC_CALL
    from perfdiag.analyzers.spans import timeline_spans

    df = timeline_spans(load_run(imported))
    converted = []
    astype = pd.Series.astype

    def spy(self, dtype, *a, **k):
        if dtype is str:
            converted.append(len(self))
        return astype(self, dtype, *a, **k)

    monkeypatch.setattr(pd.Series, "astype", spy)
    syncs = gap_evidence.host_syncs(df, -1 if (df["rank_key"] == -1).all() else 0, _SYNC_CALL)
    assert len(syncs) and converted == [len(syncs)]  # not len(df): one str per span
