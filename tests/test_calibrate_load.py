"""`calibrate` on a loaded machine (issue 37 item 7): it measures what other processes
took of the CPU meanwhile, records it with the figures and warns; and a roofline whose
steps sit above 100 % of their roof says the ceilings look low instead of printing
125 % silently."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pandas as pd
import pytest

from perfdiag.analyzers.roof_check import over_roof_note
from perfdiag.hardware.ceilings import DATASHEET, MEASURED, Ceilings
from perfdiag.probes.calibrate import CalibrationPlan, calibrate, others_load
from perfdiag.probes.cpu_load import LoadMeter, OthersLoad

BURN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end: pass\n"


@pytest.fixture
def neighbour():
    """Another process burning one core for a few seconds."""
    p = subprocess.Popen([sys.executable, "-c", BURN.format(s=20)])
    time.sleep(0.3)  # let it start
    yield p
    p.kill()
    p.wait()


def test_the_meter_sees_a_neighbour_burning_a_core(neighbour):
    with LoadMeter() as m:
        time.sleep(1.0)
    load = m.result
    assert load.others_cores >= 0.6, load  # one core, less what the machine's scheduler takes
    assert load.own_cores < 0.2 and load.busy
    assert "calibrate again on a quiet machine" in load.warning()


def test_a_quiet_figure_gives_no_warning():
    assert OthersLoad(2, 1.0, 0.05, 1.0).warning() is None
    assert OthersLoad(2, 1.0, float("nan"), 1.0).warning() is None
    back = OthersLoad.from_dict(OthersLoad(2, 1.0, float("nan"), 1.0).to_dict())
    assert back.cores == 2 and back.others_cores != back.others_cores


def test_calibrate_records_the_load_with_the_figures():
    plan = CalibrationPlan(seconds_per_figure=0.02, cpu_matmul_n=128, cpu_copy_bytes=2**20)
    (cpu,) = calibrate(plan, gpus=False)
    load = others_load(cpu)
    assert load is not None and load.seconds > 0 and load.cores >= 1
    assert json.loads(json.dumps(cpu.to_dict()))["details"]["others_load"]["cores"] == load.cores


def test_calibrate_on_a_loaded_machine_warns(tmp_path, cli, neighbour):
    r = cli("calibrate", "--ceilings-dir", tmp_path, "--seconds", "0.05", "--cpu-only")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "warning" in text and "other processes used" in text, r.stdout
    r = cli("calibrate", "--ceilings-dir", tmp_path, "--seconds", "0.05", "--cpu-only", "--json")
    data = json.loads(r.stdout)
    assert data["warnings"] and data["devices"][0]["details"]["others_load"]["others_cores"] > 0.25


def _ceilings(kind=MEASURED, others=None) -> Ceilings:
    load = {"cores": 2, "seconds": 3.0, "others_cores": others, "own_cores": 1.0}
    details = {} if others is None else {"others_load": load}
    return Ceilings("cpu", {"float32": 1e11}, 1e10, kind, "test", details)


def test_steps_above_their_roof_say_the_ceilings_look_low():
    steps = pd.DataFrame({"pct_of_roof": [40.0, 125.0, 110.0, float("nan")]})
    note = over_roof_note(steps, _ceilings(others=0.9))
    assert note.startswith("2 of 3 steps above 100 % of their roof (up to 125 %)")
    assert "ceilings look low" in note and "0.9 cores" in note
    assert "quiet machine" in over_roof_note(steps, _ceilings())
    assert "perfdiag calibrate" in over_roof_note(steps, _ceilings(DATASHEET))
    assert over_roof_note(steps[steps["pct_of_roof"] < 100], _ceilings()) is None
    assert over_roof_note(pd.DataFrame({"pct_of_roof": []}), _ceilings()) is None


def test_timeline_says_so_beside_the_roofline(tmp_path, cli):
    from test_calibrate import _run_with_model

    from perfdiag.hardware.ceilings import save_measured

    low = _ceilings(others=1.2)
    low = Ceilings("cpu", {"float32": 1e3}, 1e3, MEASURED, "test", low.details)  # far too low
    save_measured([low], tmp_path / "c")
    _run_with_model(tmp_path / "run")
    r = cli("timeline", tmp_path / "run", "--ceilings-dir", tmp_path / "c")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "steps above 100 % of their roof" in text and "1.2 cores" in text, r.stdout
