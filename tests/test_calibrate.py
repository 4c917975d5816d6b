"""`perfdiag calibrate` measures this machine and a run's roofline then uses those figures
(and records which ceilings it used)."""

import json

import pytest

from perfdiag.analyzers.roofline import roofline_report
from perfdiag.hardware.ceilings import MEASURED, load_measured, resolve
from perfdiag.probes.calibrate import CalibrationPlan, calibrate
from perfdiag.traces.reader import load_run
from perfdiag.traces.schema import Span, Step
from perfdiag.traces.writer import RunWriter

MODEL = dict(
    vocab_size=259, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=16,
)  # fmt: skip


def test_calibrate_measures_the_cpu_quickly():
    plan = CalibrationPlan(seconds_per_figure=0.02, cpu_matmul_n=128, cpu_copy_bytes=2**20)
    (cpu,) = calibrate(plan, gpus=False)
    assert cpu.device == "cpu" and cpu.kind == MEASURED
    assert cpu.flops_per_s["float32"] > 1e8 and cpu.bytes_per_s > 1e8
    assert cpu.details["matmul_n"] == 128
    with pytest.raises(ValueError):
        CalibrationPlan(seconds_per_figure=0)


def _run_with_model(path):
    t0 = 10**18
    with RunWriter(
        path,
        command=["test"],
        config={"engine_config": {"model": MODEL, "dtype": "float32"}},
        environment_info={"python": "3"},
    ) as w:
        w.table("steps").append(Step(0, t0, t0 + 2_000_000, 1, 16, 0, 16))
        w.table("steps").append(Step(1, t0 + 3_000_000, t0 + 3_500_000, 0, 0, 1, 17))
        w.table("spans").append(
            Span(
                "triton_rmsnorm",
                "kernel",
                t0 + 10,
                1_000,
                device=0,
                stream=7,
                flops=4_000_000,
                bytes=1_000_000,
            )
        )


def test_calibrated_ceilings_drive_the_roofline(tmp_path, cli):
    ceilings = tmp_path / "ceilings"
    r = cli("calibrate", "--ceilings-dir", ceilings, "--seconds", "0.05", "--cpu-only", "--json")
    assert r.returncode == 0, r.stderr
    stored = json.loads(r.stdout)
    (measured,) = load_measured(ceilings)
    assert measured.kind == MEASURED and str(ceilings) in measured.source
    assert measured.flops_per_s == stored["devices"][0]["flops_per_s"]
    assert resolve("cpu", ceilings).source == measured.source

    _run_with_model(tmp_path / "run")
    report = roofline_report(load_run(tmp_path / "run"), ceilings_dir=ceilings)
    assert report.ceilings == measured and report.dtype == "float32"
    assert report.steps["step_id"].tolist() == [0, 1]
    assert (report.steps["flops"] > 0).all()
    peak = measured.flops_per_s["float32"]
    assert report.steps["pct_of_peak_flops"].iloc[0] == pytest.approx(
        100 * report.steps["flops"].iloc[0] / 2e-3 / peak
    )
    assert report.spans["name"].tolist() == ["triton_rmsnorm"]
    assert report.spans["intensity"].iloc[0] == 4.0

    t = cli("timeline", tmp_path / "run", "--ceilings-dir", ceilings, "--json")
    assert t.returncode == 0, t.stderr
    used = json.loads(t.stdout)["roofline"]["ceilings"]
    assert used["kind"] == "measured" and used["flops_per_s"] == measured.flops_per_s
    saved = json.loads((tmp_path / "run" / "results" / "roofline.json").read_text())
    assert saved["ceilings"]["source"] == measured.source  # the run records what it used
    # without measured figures the datasheet (generic CPU) is used, and says so
    (tmp_path / "empty").mkdir()  # a directory that is not there is an error
    t = cli("timeline", tmp_path / "run", "--ceilings-dir", tmp_path / "empty", "--json")
    assert json.loads(t.stdout)["roofline"]["ceilings"]["kind"] == "datasheet"


def test_bad_ceilings_file_is_one_line_error(tmp_path, cli):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "x.json").write_text("{not json")
    _run_with_model(tmp_path / "run")
    r = cli("timeline", tmp_path / "run", "--ceilings-dir", tmp_path / "c")
    assert r.returncode == 1 and "not a ceilings file" in r.stderr and "Traceback" not in r.stderr
