"""Rank identity of imported traces: `distributedInfo` wherever it stands in the file,
two files of one rank refused, disagreeing files warned about, `--rank` overrides."""

import gzip
import json
from pathlib import Path

import pytest

import perfdiag
from perfdiag.errors import ConfigError
from perfdiag.traces.importers.kineto import import_kineto
from perfdiag.traces.importers.kineto_identity import read_identity, tail_members

KINETO = Path(__file__).resolve().parent / "data" / "kineto"  # real traces, as in conftest.py
EXCERPT = Path(__file__).parent / "data" / "kineto_excerpt.json"


def _excerpt(info: dict | None, where: str = "before", device: str | None = None) -> dict:
    """The excerpt's document with `distributedInfo` moved (before/after the events) or
    dropped, as an ordered dict ready to dump."""
    doc = json.loads(EXCERPT.read_text())
    doc.pop("distributedInfo")
    if device is not None:
        doc["deviceProperties"][0]["name"] = device
    events = doc.pop("traceEvents")
    out = {k: v for k, v in doc.items() if k == "schemaVersion"}
    out["deviceProperties"] = doc["deviceProperties"]
    if info is not None and where == "before":
        out["distributedInfo"] = info
    out["traceEvents"] = events
    out.update({k: v for k, v in doc.items() if k not in out})
    if info is not None and where == "after":
        out["distributedInfo"] = info
    return out


def _write(path: Path, doc: dict) -> Path:
    text = json.dumps(doc, indent=1)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize("name", ["trailing.json", "trailing.json.gz"])
def test_a_trailing_distributed_info_gives_the_rank(tmp_path, name):
    doc = _excerpt({"rank": 5, "world_size": 8}, "after")
    doc["traceEvents"] += [  # more events than read_identity looks at
        {"ph": "X", "cat": "cpu_op", "name": "filler", "pid": 100, "tid": 100,
         "ts": 1712195495501000 + i, "dur": 1} for i in range(400)
    ]  # fmt: skip
    trace = _write(tmp_path / name, doc)
    # a plain file's tail is read at once; a gzip's is found by the import, which then
    # reads the file again with the rank (no extra decompression for every gzip)
    assert read_identity(trace).tail_read == (not name.endswith(".gz"))
    summary = import_kineto([trace], tmp_path / "run")
    run = perfdiag.load_run(tmp_path / "run")
    assert summary.files[0].rank == 5 and summary.files[0].rank_source == "distributedInfo"
    assert set(run.spans["rank"]) == {5}
    meta = run.manifest.extra["kineto"]["files"][0]
    assert (meta["rank"], meta["world_size"], meta["rank_source"]) == (5, 8, "distributedInfo")


def test_the_tail_is_found_past_lookalikes_and_a_large_distributed_info(tmp_path):
    doc = _excerpt(None)
    # events whose args hold `], "` (the array-end pattern) just before the real end
    doc["traceEvents"] += [
        {"ph": "X", "cat": "cpu_op", "name": 'x], "distributedInfo": {"rank": 9}}',
         "pid": 1, "tid": 1, "ts": 1712195495501000 + i, "dur": 1,
         "args": {"Input Dims": [[1, 2]], "tail": '], "rank": 3}'}}
        for i in range(50)
    ]  # fmt: skip
    pg = [{"pg_name": str(i), "ranks": list(range(300))} for i in range(10)]
    doc["distributedInfo"] = {"rank": 34, "world_size": 300, "pg_config": pg}
    doc["baseTimeNanoseconds"] = 1_700_000_000_000_000_000
    trace = _write(tmp_path / "big.json.gz", doc)
    members = tail_members(trace)
    assert members["distributedInfo"]["rank"] == 34 and "traceName" in members
    ident = read_identity(trace, need_base=True)
    assert (ident.rank, ident.world_size) == (34, 300)
    assert ident.base_time_ns == 1_700_000_000_000_000_000


def test_tensorboard_export_reimports_with_its_ranks(tmp_path):
    from perfdiag.traces.exporters import export_run

    a = _write(tmp_path / "r0.json", _excerpt({"rank": 0, "world_size": 2}))
    b = _write(tmp_path / "r1.json", _excerpt({"rank": 1, "world_size": 2}))
    import_kineto([a, b], tmp_path / "run")
    result = export_run(tmp_path / "run", "tensorboard", tmp_path / "tb")
    files = sorted(result.files)
    assert len(files) == 2
    text = files[0].read_text()
    assert text.index('"distributedInfo"') < text.index('"traceEvents"')  # header first
    again = import_kineto(files, tmp_path / "again")
    assert [f.rank for f in again.files] == [0, 1]
    assert not again.warnings
    run = perfdiag.load_run(tmp_path / "again")
    assert sorted(run.spans["rank"].unique()) == [0, 1]


def test_two_files_of_one_rank_are_refused(tmp_path):
    a = _write(tmp_path / "a.json", _excerpt({"rank": 0}))
    b = _write(tmp_path / "b.json.gz", _excerpt({"rank": 0}, "after"))
    with pytest.raises(ConfigError, match=r"are both rank 0 \(distributedInfo\)") as info:
        import_kineto([a, b], tmp_path / "run")
    assert "\n" not in str(info.value) and "--rank" in str(info.value)
    assert not (tmp_path / "run").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json.gz"]


def test_rank_overrides_and_files_without_a_rank(tmp_path):
    a = _write(tmp_path / "a.json", _excerpt({"rank": 0}))
    b = _write(tmp_path / "b.json", _excerpt({"rank": 0}))
    s = import_kineto([a, b], tmp_path / "run", ranks=[2, 7])
    assert [(f.rank, f.rank_source) for f in s.files] == [(2, "--rank"), (7, "--rank")]
    assert any("--rank 7 is used instead" in w for w in s.warnings)
    assert sorted(perfdiag.load_run(tmp_path / "run").spans["rank"].unique()) == [2, 7]
    with pytest.raises(ConfigError, match="give one --rank per file"):
        import_kineto([a, b], tmp_path / "run2", ranks=[1])
    with pytest.raises(ConfigError, match="both rank 4 \\(--rank\\)"):
        import_kineto([a, b], tmp_path / "run3", ranks=[4, 4])
    # a file without distributedInfo takes the first rank not claimed by another file
    c = _write(tmp_path / "c.json", _excerpt(None))
    s = import_kineto([c, a], tmp_path / "run4")
    assert [(f.rank, f.rank_source) for f in s.files] == [(1, "position"), (0, "distributedInfo")]
    assert any("taken as rank 1 by its place" in w for w in s.warnings)
    one = import_kineto([c], tmp_path / "run5")
    assert one.files[0].rank is None and not one.warnings  # one file: no rank needed


def test_disagreeing_files_are_warned_about(tmp_path):
    a = _write(tmp_path / "a.json", _excerpt({"rank": 0, "world_size": 2}))
    b = _write(tmp_path / "b.json", _excerpt({"rank": 1, "world_size": 4}, device="Tesla V100"))
    s = import_kineto([a, b], tmp_path / "run")
    text = " | ".join(s.warnings)
    assert "disagree on the world size (a.json 2, b.json 4)" in text
    assert "disagree on the device (a.json NVIDIA H100 80GB HBM3, b.json Tesla V100)" in text
    assert "apart" not in text  # same start
    run = perfdiag.load_run(tmp_path / "run")
    assert run.manifest.extra["kineto"]["warnings"] == s.warnings


def test_shared_traces_of_one_rank_are_refused_in_one_line(tmp_path, cli):
    a, b = KINETO / "a100_alexnet_cuda_sync.json.gz", KINETO / "a100_nccl_comm.json.gz"
    r = cli("import", a, b, "--out", tmp_path / "run")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "both rank 0" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()
    ok = cli("import", a, b, "--rank", "0", "--rank", "1", "--out", tmp_path / "run", "--json")
    assert ok.returncode == 0, ok.stderr
    summary = json.loads(ok.stdout)
    assert [f["rank"] for f in summary["files"]] == [0, 1]
    assert any("days apart" in w for w in summary["warnings"])
    assert "perfdiag: warning: the traces start" in ok.stderr


def test_shared_traces_of_two_jobs_are_warned_about(tmp_path):
    files = [KINETO / "a100_nccl_comm.json.gz", KINETO / "sampled_rank-1.json.gz"]
    s = import_kineto(files, tmp_path / "run")
    assert [f.rank for f in s.files] == [0, 1]
    text = " | ".join(s.warnings)
    assert "world size (a100_nccl_comm.json.gz 2, sampled_rank-1.json.gz 128)" in text
    assert "390.0 days apart" in text
    same = import_kineto(
        [KINETO / "sampled_rank-0.json.gz", KINETO / "sampled_rank-1.json.gz"], tmp_path / "r2"
    )
    assert not same.warnings  # the two ranks of one job
