"""Exports keep a trace's identity: the TensorBoard and Chrome exports of real Kineto
traces carry `distributedInfo` and `deviceProperties` through unchanged, so a re-import
has the same world size, backend, rank and GPU (before, TensorBoard rewrote world_size
2 → 1 and dropped the backend; Chrome dropped both keys)."""

import gzip
import json

import pytest
from conftest import KINETO

import perfdiag
from perfdiag.traces.exporters import export_run
from perfdiag.traces.importers.kineto import import_kineto

NCCL = KINETO / "a100_nccl_comm.json.gz"  # nccl, rank 0 of 2, 8 × A100
SAMPLED = [KINETO / "sampled_rank-0.json.gz", KINETO / "sampled_rank-1.json.gz"]  # of 128


def _header(path) -> dict:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    doc.pop("traceEvents", None)
    return doc


def _identity(run_dir) -> list[tuple]:
    m = perfdiag.load_run(run_dir).manifest
    files = m.extra["kineto"]["files"]
    gpus = [g.get("name") for g in m.environment.get("gpus") or []]
    return [(f["world_size"], f["backend"], f["rank"]) for f in files], gpus


@pytest.fixture(scope="module")
def nccl(tmp_path_factory):
    root = tmp_path_factory.mktemp("identity")
    import_kineto([NCCL], root / "run")
    return root


def test_tensorboard_export_keeps_distributed_info_and_devices(nccl):
    result = export_run(nccl / "run", "tensorboard", nccl / "tb")
    (path,) = result.files
    original, written = _header(NCCL), _header(path)
    assert written["distributedInfo"] == original["distributedInfo"]  # world_size 2, nccl
    assert written["deviceProperties"] == original["deviceProperties"]
    import_kineto([path], nccl / "tb_back")
    assert _identity(nccl / "tb_back") == ([(2, "nccl", 0)], ["NVIDIA A100-PG509-200"] * 8)


def test_chrome_export_keeps_distributed_info_and_devices(nccl):
    export_run(nccl / "run", "chrome", nccl / "x.json.gz")
    original, written = _header(NCCL), _header(nccl / "x.json.gz")
    assert written["distributedInfo"] == original["distributedInfo"]
    assert written["deviceProperties"] == original["deviceProperties"]
    import_kineto([nccl / "x.json.gz"], nccl / "chrome_back")
    assert _identity(nccl / "chrome_back") == _identity(nccl / "run")


def test_two_ranks_of_a_job_keep_their_identity(tmp_path):
    import_kineto(SAMPLED, tmp_path / "run")
    tb = export_run(tmp_path / "run", "tensorboard", tmp_path / "tb")
    infos = sorted((_header(p)["distributedInfo"] for p in tb.files), key=lambda d: d["rank"])
    assert infos == [_header(p)["distributedInfo"] for p in SAMPLED]  # world_size 128 each
    import_kineto(sorted(tb.files), tmp_path / "tb_back")
    assert _identity(tmp_path / "tb_back")[0] == [(128, "nccl", 0), (128, "nccl", 1)]
    # one Chrome file holds both ranks: the job's identity, each span its own rank
    export_run(tmp_path / "run", "chrome", tmp_path / "x.json.gz")
    assert _header(tmp_path / "x.json.gz")["distributedInfo"] == {
        "backend": "nccl",
        "world_size": 128,
    }
    import_kineto([tmp_path / "x.json.gz"], tmp_path / "chrome_back")
    (back,) = _identity(tmp_path / "chrome_back")[0]
    assert back[:2] == (128, "nccl")
    spans = perfdiag.load_run(tmp_path / "chrome_back").spans
    assert sorted(spans["rank"].dropna().unique()) == [0, 1]
