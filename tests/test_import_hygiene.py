"""Analysis must run anywhere: reading runs and analysing them never loads torch,
triton, textual or aiohttp (checked in a fresh interpreter, where nothing else imported
them)."""

import subprocess
import sys

import pytest

HEAVY = ("torch", "triton", "textual", "aiohttp")


@pytest.mark.parametrize(
    "modules",
    [
        ["perfdiag"],
        ["perfdiag.traces", "perfdiag.traces.reader", "perfdiag.traces.writer"],
        ["perfdiag.analyzers"],
        [
            "perfdiag.analyzers.report",
            "perfdiag.analyzers.roofline",
            "perfdiag.analyzers.model_flops",
            "perfdiag.hardware.ceilings",
            "perfdiag.traces.importers.kineto",
        ],
        ["perfdiag.analyzers.serving", "perfdiag.cli.analyze"],
        [
            "perfdiag.analyzers.findings",
            "perfdiag.analyzers.compare",
            "perfdiag.playbooks.schema",
            "perfdiag.playbooks.evaluate",
            "perfdiag.playbooks.comparison",
            "perfdiag.playbooks.report",
            "perfdiag.cli.compare",
        ],
        [
            "perfdiag.traces.exporters",
            "perfdiag.traces.exporters.layout",
            "perfdiag.traces.exporters.perfetto",
            "perfdiag.traces.exporters.chrome",
            "perfdiag.traces.exporters.tensorboard",
            "perfdiag.cli.export",
        ],
        ["perfdiag.analyzers.http_join", "perfdiag.cli.http_join", "perfdiag.cli.serve"],
    ],
)
def test_no_heavy_imports(modules):
    code = (
        f"import sys, importlib\nfor m in {modules!r}: importlib.import_module(m)\n"
        "import perfdiag; perfdiag.load_run\n"
        f"print(','.join(h for h in {HEAVY!r} if h in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"{modules} imported {result.stdout.strip()}"
