"""benchmarks/diagnosis/scenarios.py, loaded once for every test file that runs its
scenarios (benchmarks/ is not a package perfdiag installs)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_path = Path(__file__).parents[1] / "benchmarks" / "diagnosis" / "scenarios.py"
_spec = importlib.util.spec_from_file_location("diagnosis_scenarios", _path)
sc = sys.modules.get(_spec.name)
if sc is None:
    sc = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = sc  # dataclasses look their module up while the class is built
    _spec.loader.exec_module(sc)
