"""Per-rank traces: their headers are checked in one place (``traces.ranks.rank_of_meta``): what a
header says of its rank, world, pid and host is a whole number in range, or a name, and
agrees with itself — else one line naming the file and the field, exit status 2.

Each case is the real 2-H200 DDP pair with rank 1's header changed as a damaged or
hand-edited trace would have it."""

from __future__ import annotations

import copy
import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from profkit.cli import app

DATA = Path(__file__).parent / "data"
runner = CliRunner()
Header = dict[str, Any]


def _set(where: str, key: str, value: Any) -> Callable[[Header], None]:
    return lambda doc: doc[where].__setitem__(key, value)


@pytest.fixture(scope="module")
def ranks() -> list[Header]:
    return [
        json.loads(
            gzip.decompress((DATA / f"torch-h200x2-small-ddp2-rank{r}.json.gz").read_bytes())
        )
        for r in (0, 1)
    ]


def _kernels(tmp_path: Path, ranks: list[Header], change: Callable[[Header], None]) -> Any:
    paths = []
    for rank, doc in enumerate(ranks):
        doc = copy.deepcopy(doc)
        if rank == 1:
            change(doc)
        paths.append(tmp_path / f"run-rank{rank}.json")
        paths[-1].write_text(json.dumps(doc))
    return runner.invoke(app, ["kernels", *map(str, paths), "--format", "json", "--no-cache"])


REFUSED = {
    "rank a word": (_set("distributedInfo", "rank", "one"), "distributedInfo's rank is 'one'"),
    "rank a list": (_set("distributedInfo", "rank", [1]), "distributedInfo's rank is [1]"),
    "rank negative": (_set("distributedInfo", "rank", -5), "distributedInfo's rank is -5"),
    "rank a fraction": (_set("distributedInfo", "rank", 1.5), "distributedInfo's rank is 1.5"),
    "rank true": (_set("distributedInfo", "rank", True), "distributedInfo's rank is True"),
    "rank outside its world": (
        _set("distributedInfo", "rank", 5),
        "distributedInfo says rank 5 of a world of 2",
    ),
    "world a word": (
        _set("distributedInfo", "world_size", "x"),
        "distributedInfo's world_size is 'x'",
    ),
    "host a list": (_set("profkit", "host", ["a"]), "the profkit header's host is ['a']"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_header_that_contradicts_itself_is_one_line(
    tmp_path: Path, ranks: list[Header], case: str
) -> None:
    change, said = REFUSED[case]
    result = _kernels(tmp_path, ranks, change)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "run-rank1.json" in lines[0] and said in lines[0]


def _without_distributed_info(doc: Header) -> None:
    """A header that names its rank through profkit's record alone, with a pid no process
    can have: the trace's own pid (its events') is the one kept."""
    del doc["distributedInfo"]
    doc["profkit"]["pid"] = 2**62


@pytest.mark.parametrize(
    "change",
    [
        _set("profkit", "pid", -5),
        _set("profkit", "pid", "abc"),
        _set("distributedInfo", "world_size", 0),  # unknown, as torch writes before init
        _without_distributed_info,
    ],
    ids=["header pid negative", "header pid a word", "world 0", "profkit record alone"],
)
def test_what_the_events_say_wins_over_a_damaged_header_pid(
    tmp_path: Path, ranks: list[Header], change: Callable[[Header], None]
) -> None:
    """Each rank keeps its 2,060 kernels and its real pid."""
    result = _kernels(tmp_path, ranks, change)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["totals"]["kernels"] == 4120
    assert [(r["rank"], r["pid"], r["kernels"]) for r in report["ranks"]] == [
        (0, 1156, 2060),
        (1, 1157, 2060),
    ]


@pytest.mark.parametrize(("days", "hours"), [(1, "24.0"), (30, "720.0")])
def test_ranks_captured_apart_are_two_runs(
    tmp_path: Path, ranks: list[Header], days: int, hours: str
) -> None:
    """Rank 1's trace taken a day (or a month: past what one job's time keys span) after
    rank 0's: not one run's ranks, said in one line, never joined with the waits inverted."""

    def later(doc: Header) -> None:
        doc["baseTimeNanoseconds"] += days * 86_400 * 10**9

    result = _kernels(tmp_path, ranks, later)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert f"rank 1's capture begins {hours} h after rank 0's ends" in lines[0]


def test_rank_is_refused_where_traces_are_compared_side_by_side() -> None:
    """Two one-GPU exports are compared, not ranks: ``--rank`` would be silently ignored."""
    result = runner.invoke(app, [
        "kernels", str(DATA / "nsys-2025.3-h100-small-fp32.sqlite.xz"),
        str(DATA / "nsys-2025.3-h100-small-bf16.sqlite.xz"), "--rank", "0", "--no-cache",
    ])  # fmt: skip
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: --rank picks a rank of one job's traces; these traces are compared side by side"
    ]
