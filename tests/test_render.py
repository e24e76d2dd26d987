"""Rendering details that matter to readers: markdown that GitHub shows whole, exact counts."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from profkit.analysis.crosscheck import compare_phases
from profkit.formats import Encoded, dumps, encoded_object, markdown_table


def test_markdown_shows_kernel_names_as_code_and_escapes_pipes() -> None:
    """`<...>` would be read as HTML and hidden; `&lt;` read badly: names are code."""
    name = "multi_tensor_apply_kernel<TensorListMetadata<3>, a|b>"
    text = markdown_table(pd.DataFrame({"name": [name, "forward"], "ms": [1.5, 2.0]}))
    assert "| `multi_tensor_apply_kernel<TensorListMetadata<3>, a\\|b>` |" in text
    assert "| forward |" in text  # plain names stay plain
    assert text.splitlines()[-2].count(" | ") == 1  # still two cells


def test_per_step_counts_keep_their_fractions() -> None:
    a = pd.DataFrame({"phase": ["optimizer"], "kernels": [18.8], "gpu_time_ms": [1.0]})
    b = pd.DataFrame({"phase": ["optimizer"], "kernels": [19.0], "gpu_time_ms": [1.0]})
    table = compare_phases([("a", a), ("b", b)])
    assert table["a kernels"].tolist() == [18.8, 18.8]
    assert table["b kernels"].dtype == "int64"


def test_out_suffix_picks_the_format_unless_format_is_given(tmp_path) -> None:
    import json

    from typer.testing import CliRunner

    from profkit.cli import app
    from profkit.formats import file_format

    runner = CliRunner()
    for name, check in (
        ("s.csv", lambda t: t.startswith("size,d_model,")),
        ("s.json", lambda t: json.loads(t)[1]["params"] == 128_625_408),
        ("s.md", lambda t: t.startswith("### Model sizes")),
        ("s.txt", lambda t: t.startswith("### Model sizes")),  # unknown suffix: markdown
    ):
        out = tmp_path / name
        assert runner.invoke(app, ["sizes", "--out", str(out)]).exit_code == 0
        assert check(out.read_text()), name
    assert file_format("md", tmp_path / "x.csv") == "md"  # an explicit --format wins
    assert file_format("table", None) == "table"


def test_one_progress_bar_shows_the_current_item_and_is_off_off_a_terminal() -> None:
    import io

    from rich.console import Console

    from profkit.cli.render import progress_bar

    screen = Console(file=io.StringIO(), force_terminal=True, width=120, color_system=None)
    bar = progress_bar(on=screen)
    assert not bar.disable
    first = bar.add_task("bench", total=8)
    bar.update(first, completed=3, current="small-ctx64-train-fp32")
    bar.add_task("torch.profiler forward", total=2)  # a task with no current item
    screen.print(bar.make_tasks_table(bar.tasks))
    lines = screen.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert "bench" in lines[0] and "3/8" in lines[0] and "small-ctx64-train-fp32" in lines[0]
    assert "torch.profiler forward" in lines[1] and "0/2" in lines[1]
    piped = Console(file=io.StringIO())
    assert progress_bar(on=piped).disable


def test_a_table_wider_than_the_terminal_hides_details_not_names() -> None:
    """At 80 columns the real kernel table (from the committed H100 export) keeps its names
    readable: details go first (std, min, max, grid, block...), the caption says which,
    and no line is wider than the terminal; at 200 columns every column stays."""
    from rich.console import Console

    from profkit.analysis import kernel_report
    from profkit.analysis.presentation import display_tables
    from profkit.cli.render import NARROW_HIDDEN, rich_table
    from profkit.traces.job import load

    export = Path(__file__).parent / "data" / "nsys-2025.3-h100-small-fp32.sqlite.xz"
    report = kernel_report(load([export]))
    top = display_tables(report)[1][1].head(3)  # the top kernels of all phases
    assert list(top.columns)[:2] == ["short_name", "category"] and "grid" in top.columns
    hidden_at_80 = ["std_us", "min_us", "max_us", "grid", "block", "med_us", "instances"]
    for width, hidden in ((80, hidden_at_80), (200, [])):
        console = Console(width=width, record=True, color_system=None)
        console.print(rich_table(top, "top", width=width))
        text = console.export_text()
        lines = text.splitlines()
        assert max(len(line) for line in lines) <= width
        header = next(line for line in lines if "short_name" in line)
        shown = [c for c in top.columns if f" {c} " in header]
        assert shown == [c for c in top.columns if c not in hidden]
        assert ("not shown at 80 columns: " + ", ".join(hidden) in " ".join(lines)) == bool(hidden)
        assert "sm80_xmma_g" in text  # the names, not squeezed away
        # One line each, and still three different names (they differ in the middle).
        names = [line.split("│")[1].strip() for line in lines if "sm80_xmma" in line]
        assert len(names) == len(set(names)) == 3, names
        if width == 80:
            assert [n[n.index("…") + 1 :][:4] for n in names] == ["tn_n", "nt_n", "nn_n"]
    assert all(c in NARROW_HIDDEN for c in ("std_us", "grid", "block"))


def test_fit_names_keeps_different_names_different() -> None:
    """The issue's cases: GEMMs that differ in the middle, templates cut in the middle,
    and two lambda instances of one functor."""
    from profkit.analysis.names import fit_names, short_kernel_name

    lam = (
        "void at::native::vectorized_elementwise_kernel<(int)4, void at::native::<unnamed>::"
        "pow_tensor_scalar_kernel_impl<float, float>(at::TensorIteratorBase &, T2)::"
        "[lambda(float) (instance {})], std::array<char *, (unsigned long)2>>(int, T2, T3)"
    )
    one, two = short_kernel_name(lam.format(1)), short_kernel_name(lam.format(2))
    assert one == "vectorized_elementwise_kernel<4, pow_tensor_scalar_kernel_impl<float>>"
    assert two == "vectorized_elementwise_kernel<4, pow_tensor_scalar_kernel_impl<float>#2>"
    torch_two = lam.format(2).replace("[lambda(float) (instance 2)]", "{lambda(float)#2}")
    assert short_kernel_name(torch_two) == two  # torch.profiler's spelling too
    names = [
        "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_ffma_kernel",
        "sm80_xmma_gemm_f32f32_f32f32_f32_nt_n_tilesize64x64x8_ffma_kernel",
        "multi_tensor_apply_kernel<TensorListMetadata<3>, PointwiseOpScalarFunctor<float, 3, 3, 0>>",
        "multi_tensor_apply_kernel<TensorListMetadata<2>, PointwiseOpScalarFunctor<float, 3, 3, 0>>",
        one, two, one, "forward",
    ]  # fmt: skip
    for width in (24, 34, 50, 80):
        shown = fit_names(names, width)
        assert all(len(s) <= width for s in shown)
        assert len(set(shown)) == len(set(names)) and shown[4] == shown[6]  # same name, same text
        assert shown[-1] == "forward"
    # Too long for its column: numbers and index types below the top level go first, and
    # a cut keeps the end, where the variants of one kernel differ.
    reduce = "reduce_kernel<512, 1, ReduceOp<float, func_wrapper_t<float, sum_functor<float>>, unsigned int, float, 4, 4>>"
    assert fit_names([reduce], 90) == [
        "reduce_kernel<512, 1, ReduceOp<float, func_wrapper_t<float, sum_functor<float>>, float>>"
    ]


@pytest.mark.parametrize(
    "value",
    [
        {"a": 1, "ranks": [{"x": [1, 2, {"y": None}], "z": "é\u0000"}, {}, []], "b": 2.5},
        [[{"deep": {"er": [float("nan"), 3]}}]],
        {"only": {}},
    ],
)
def test_encoded_json_is_written_in_as_its_value(value: object) -> None:
    """JSON text made already (a node's ranks, on its worker) gives the text ``dumps``
    gives of the value itself, at any depth, in objects and lists, empty or not."""

    def encoded(v: object) -> object:  # every container below the top made already
        if isinstance(v, dict):
            return {k: Encoded(dumps(x)) if isinstance(x, dict | list) else x for k, x in v.items()}
        if isinstance(v, list):
            return [Encoded(dumps(x)) if isinstance(x, dict | list) else x for x in v]
        return v

    assert dumps(encoded(value)) == dumps(value)
    head, tail = {"rank": 3, "host": "n1"}, {"kernels": 5, "phases": [{"p": 1}]}
    joined = encoded_object(head, Encoded(dumps(tail)))
    assert joined == dumps({**head, **tail})
    assert dumps({"ranks": [joined]}) == dumps({"ranks": [{**head, **tail}]})
    assert encoded_object({}, Encoded(dumps(tail))) == dumps(tail)
    assert encoded_object(head, Encoded("{}")) == dumps(head)
