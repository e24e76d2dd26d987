"""The scripts under benchmarks/ as modules, for tests that use their generators."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def benchmark(name: str) -> ModuleType:
    """``benchmarks/NAME.py``, imported (registered in ``sys.modules``: its dataclasses
    and pickles need their module found)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
