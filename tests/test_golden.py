"""Today's ``--format json`` reports equal the golden ones recorded before the restructuring.

The trace-reading engine had two paths, the pandas full tables and the compact columns,
each taken for some inputs and options; they become one. Whatever it becomes, every
report it prints must stay what it was. ``tests/data/golden/`` holds the JSON of
``profkit kernels`` and ``profkit diff`` for every committed trace fixture and every option
set of ``tests/golden_cases.py`` (phases, ranges, top, forced phase sources, ranks, the
per-rank torch traces and two nodes read as one job, side-by-side comparisons, diffs, and
what is refused with exit status 2), as recorded from the code of the commit its README
names. Each case runs here through the CLI in this process, as a user types it.

Compared: the exit status, stderr (warnings and error lines) and the JSON: keys, their
order, strings, ints and bools exactly (an int that became a float is a change), floats to
1e-9 relative (1e-12 absolute near zero): standard deviations and sums taken in another
order may differ in their last digits, nothing more. Input paths are compared by file
name. A golden that is wrong is regenerated only for a documented bug fix
(``tests/make_golden.py``), never to make this pass.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from golden_cases import CASES, GOLDEN, Case, Inputs, golden_path, run
from typer.testing import CliRunner

REL, ABS = 1e-9, 1e-12
ADDED_TO_SOURCE = ("phases_from", "patterns")
"""Keys a report's ``source`` gained after the goldens were recorded (issue 25: what the
phases came from, the framework patterns recognized); every other key is compared."""
runner = CliRunner()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Inputs:
    return Inputs(tmp_path_factory.mktemp("golden"))


def differences(got: Any, want: Any, where: str = "") -> list[str]:
    """Where ``got`` differs from ``want`` (empty when they agree), one line each."""
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return [f"{where}: {type(got).__name__} instead of an object"]
        if where.endswith(".source"):
            got = {k: v for k, v in got.items() if k not in ADDED_TO_SOURCE or k in want}
        if list(got) != list(want):
            missing, extra = set(want) - set(got), set(got) - set(want)
            what = f"missing {sorted(missing)}, extra {sorted(extra)}" if missing or extra else (
                "the same keys in another order"
            )  # fmt: skip
            return [f"{where}: keys differ: {what}"]
        return [d for key in want for d in differences(got[key], want[key], f"{where}.{key}")]
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            size = len(got) if isinstance(got, list) else type(got).__name__
            return [f"{where}: {size} items instead of {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True))
                for d in differences(g, w, f"{where}[{i}]")]  # fmt: skip
    if isinstance(want, float) and type(got) is float:
        same = (math.isnan(got) and math.isnan(want)) or math.isclose(
            got, want, rel_tol=REL, abs_tol=ABS
        )
        return [] if same else [f"{where}: {got!r} instead of {want!r}"]
    if type(got) is not type(want) or got != want:
        return [f"{where}: {got!r} ({type(got).__name__}) instead of {want!r}"]
    return []


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_report_is_the_golden_one(case: Case, inputs: Inputs) -> None:
    path = golden_path(case)
    assert path.exists(), f"no golden {path.name}: record it with tests/make_golden.py"
    want = json.loads(path.read_text())
    got = run(case, inputs, runner)
    assert got["command"] == want["command"]
    assert got["exit_code"] == want["exit_code"] == case.exit_code, got["stderr"]
    assert got["stderr"] == want["stderr"]
    assert got["stdout"] == want["stdout"]
    found = differences(got["output"], want["output"])
    assert not found, f"{case.command}: {len(found)} differences\n" + "\n".join(found[:40])


def test_every_golden_file_is_a_case() -> None:
    """No golden is left over from a case that was removed (or renamed)."""
    names = {golden_path(c).name for c in CASES}
    assert len(names) == len(CASES)  # two cases never share a file
    assert {p.name for p in GOLDEN.glob("*.json")} == names


def test_the_comparison_tolerates_the_last_digits_only() -> None:
    """What :func:`differences` lets through: a float's last digits; not a changed count,
    an int turned float, a key renamed or moved, a row more."""
    want = {"kernels": 3, "std_us": 1.2345678901234, "rows": [{"a": 0.0}], "name": "x"}
    assert differences(json.loads(json.dumps(want)), want) == []
    assert differences({**want, "std_us": 1.2345678901235}, want) == []
    assert differences({**want, "rows": [{"a": 1e-13}]}, want) == []
    assert differences({**want, "std_us": 1.23457}, want)
    assert differences({**want, "kernels": 3.0}, want)
    assert differences({**want, "kernels": 4}, want)
    assert differences({**want, "name": None}, want)
    assert differences({"std_us": 1.2345678901234, **want}, want)
    source = {"source": {"path": "x"}}
    assert differences({"source": {"path": "x", "patterns": []}}, source, "") == []
    assert differences({"source": {"path": "x", "other": []}}, source, "")
    assert differences({**want, "rows": [{"a": 0.0}, {"a": 0.0}]}, want)
    assert differences({**want, "rows": [{"b": 0.0}]}, want)


def test_inputs_are_named_by_file(tmp_path: Path) -> None:
    """Paths of the inputs, which differ between machines, become file names."""
    inputs = Inputs(tmp_path)
    value = {"path": str(tmp_path / "a.sqlite"), "note": f"{tmp_path}/b.sqlite is given twice"}
    assert inputs.normalise(value) == {"path": "a.sqlite", "note": "b.sqlite is given twice"}
