"""Readable short names for kernels whose full names are C++ template instantiations.

``void at::native::vectorized_elementwise_kernel<(int)4, at::native::CUDAFunctor_add<float>,
std::array<char *, (unsigned long)3>>(int, T2, T3)`` becomes
``vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>``: namespaces, casts, parameter
lists, lambdas and ``std::array`` plumbing go; the functor that tells kernels apart stays
(nsys's own ``shortName`` would call every one of them ``vectorized_elementwise_kernel``).

:func:`factorize` numbers the names of millions of rows, so that each distinct name is
looked at once.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable

import numpy as np
import pandas as pd

MAX_CHARS = 80

_CASTS = re.compile(r"\((?:unsigned |signed )?(?:int|long long|long|short|char|bool)\)")
# nsys spells a lambda `::[lambda(float) (instance 2)]`, torch.profiler `::{lambda(float)#2}`.
_LAMBDA = re.compile(
    r"::(?:\[lambda(?:\([^()]*\))? \(instance (\d+)\)\]|\{lambda(?:\([^()]*\))?#(\d+)\}|\[lambda[^\]]*\])"
)
_OPERATOR_CALL = re.compile(r"::operator \(\)\(\)(?: const)?")
_OPERATOR = re.compile(r"::operator\s*(?:\(\))?(?:\s*const)?")
_PARENS = re.compile(r"\([^()]*\)")
_NAMESPACE = re.compile(r"\b[A-Za-z_]\w*::")
_STD_ARRAY = re.compile(r",\s*array<char\s*\*, \d+\w*>")
_SPACES = re.compile(r"\s+")
_REPEATS = re.compile(r"\b([A-Za-z_]\w*)(?:, \1\b)+")  # float, float, float -> float
# cuBLAS kernel-name parts that tell variants of one tile shape apart, not what it computes.
_CUBLAS_NOISE = re.compile(
    r"_stage\d+|_warp(?:group)?size\d+x\d+x\d+|_align[ac]\d+|_execute|__\d+x_cublas$"
)
# Template wrappers that only forward the interesting functor.
_WRAPPERS = ("gpu_kernel_impl_nocast<", "gpu_kernel_impl<")


@functools.lru_cache(maxsize=1 << 14)  # a report shortens the same names per rank and table
def short_kernel_name(name: str, max_chars: int = MAX_CHARS) -> str:
    """A short, readable form of a kernel name (plain names are kept as they are)."""
    text = name.strip()
    if re.fullmatch(r"[\w.\-\[\] ]+", text) is not None:  # a plain identifier
        if "xmma" in text or text.endswith("cublas"):
            text = _CUBLAS_NOISE.sub("", text)
        if len(text) > max_chars:  # variants differ at either end: keep both
            tail = max_chars // 3
            text = text[: max_chars - 1 - tail] + "…" + text[-tail:]
        return text
    text = text.removeprefix("void ")
    text = text.replace("<unnamed>::", "").replace("(anonymous namespace)::", "")
    text = _LAMBDA.sub(_lambda_instance, text)  # before the casts: `{lambda(int)#2}`
    text = _CASTS.sub("", text)
    text = _OPERATOR_CALL.sub("", text)
    previous = None
    while previous != text:  # innermost parentheses first: nested parameter lists
        previous, text = text, _PARENS.sub("", text)
    text = _OPERATOR.sub("", text)  # `sum_functor<float>::operator ()` once its (...) went
    text = _NAMESPACE.sub("", text)
    text = re.sub(r"\bvoid ", "", text)
    text = _STD_ARRAY.sub("", text)
    for wrapper in _WRAPPERS:
        text = _unwrap(text, wrapper)
    text = _REPEATS.sub(r"\1", text)
    text = _SPACES.sub(" ", text).strip()
    text = re.sub(r"(?<=>) (?=>)", "", text)  # torch.profiler's `> >` as nsys writes it
    return abbreviate(text, max_chars)


def _lambda_instance(match: re.Match[str]) -> str:
    """Nothing for a lambda's first instance, ``#N`` for the others (a different kernel)."""
    number = match[1] or match[2]
    return f"#{number}" if number and number != "1" else ""


# Template arguments that size or index a kernel, not what it computes: left out of a name
# too long for its column below the top level (`ReduceOp<float, ..., unsigned int, 4, 4>`).
_PLAIN_ARG = re.compile(
    r"\d+|true|false|bool|(?:unsigned |signed )?(?:int|long long|long|short|char)"
)


def lighten(text: str) -> str:
    """``text`` without the numeric and index-type template arguments below the top level
    (the top level's, such as a block size, tell launch variants apart)."""
    out: list[str] = []  # the text so far; each open bracket's argument starts at a mark
    starts: list[int] = []
    for char in text:
        if char == "<":
            out.append(char)
            starts.append(len(out))
        elif char in ",>" and starts:
            start = starts[-1]
            if len(starts) >= 2 and _PLAIN_ARG.fullmatch("".join(out[start:]).strip()):
                del out[start:]  # the argument goes, and the comma before it
                if out and out[-1] == ",":
                    out.pop()
            if char == ",":
                out.append(",")
                starts[-1] = len(out)
            else:
                while out and out[-1] in ", ":
                    out.pop()
                if out and out[-1] == "<":  # a list left empty goes with its brackets
                    out.pop()
                else:
                    out.append(">")
                starts.pop()
        else:
            out.append(char)
    text = "".join(out)
    text = re.sub(r"<\s*,\s*", "<", text)
    return _SPACES.sub(" ", re.sub(r",\s*(?=[,>])", "", text)).strip()


def abbreviate(text: str, width: int, tail: int | None = None) -> str:
    """``text`` in at most ``width`` characters: without the numeric template arguments below
    the top level (:func:`lighten`) if that is too long, then cut in the middle with the end
    kept (``head…tail``; variants of one kernel differ in their last parts)."""
    if len(text) <= width:
        return text
    light = lighten(text)
    return middle_cut(light, width, tail)


def middle_cut(text: str, width: int, tail: int | None = None) -> str:
    """``head…tail`` in ``width`` characters (``tail`` of them from the end; default about
    three fifths, the end of a kernel name being what tells its variants apart)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    tail = (width - 1) * 3 // 5 if tail is None else max(0, min(tail, width - 1))
    head = width - 1 - tail
    return text[:head] + "…" + (text[-tail:] if tail else "")


def fit_names(names: list[str], width: int) -> list[str]:
    """``names`` (a table's name column) each in at most ``width`` characters, names that
    differ still differing: :func:`abbreviate` first; names it makes equal are cut with
    more of their tail shown, else numbered (``…#2``)."""
    shown = [abbreviate(n, width) for n in names]
    for _ in range(2):
        groups: dict[str, set[str]] = {}
        for name, short in zip(names, shown, strict=True):
            groups.setdefault(short, set()).add(name)
        clashes = {short: sorted(full) for short, full in groups.items() if len(full) > 1}
        if not clashes:
            return shown
        taken = set(shown) - set(clashes)
        for short, full in clashes.items():
            fixed = _tell_apart(full, width, taken)
            taken |= set(fixed.values())
            shown = [
                fixed.get(n, s) if s == short else s for n, s in zip(names, shown, strict=True)
            ]
    return shown


def _tell_apart(names: list[str], width: int, taken: set[str]) -> dict[str, str]:
    """Distinct cuts of ``names`` in ``width`` characters, not among ``taken``: the start
    they share folded to ``…`` (``sm80_xmma_gemm…nn_n_tilesize64x64x8…``), else another cut."""
    light = [lighten(n) if len(n) > width else n for n in names]
    shared = len(os.path.commonprefix(light))  # noqa: RUF071 - characters are what we cut
    head = min(shared, width // 3)
    if 0 < head < shared and width - head - 1 > 4:
        cuts = {
            name: short[:head] + "…" + middle_cut(short[shared:], width - head - 1)
            for name, short in zip(names, light, strict=True)
        }
        if len(set(cuts.values())) == len(names) and not taken & set(cuts.values()):
            return cuts
    for tail in [*range((width - 1) * 3 // 5, width - 1), *range((width - 1) * 3 // 5, 0, -1)]:
        cuts = {n: abbreviate(n, width, tail) for n in names}
        if len(set(cuts.values())) == len(names) and not taken & set(cuts.values()):
            return cuts
    out = {}  # alike at both ends: number them, in the order of their full names
    for number, name in enumerate(names, 1):
        mark = f" #{number}"
        out[name] = abbreviate(name, max(width - len(mark), 1)) + mark
    return out


def _unwrap(text: str, wrapper: str) -> str:
    """``a<w<x>>`` -> ``a<x>`` for the template ``w``: drop it and its closing bracket."""
    while (at := text.find(wrapper)) >= 0:
        depth = 0
        for index in range(at + len(wrapper) - 1, len(text)):
            depth += {"<": 1, ">": -1}.get(text[index], 0)
            if depth == 0:
                text = text[:at] + text[at + len(wrapper) : index] + text[index + 1 :]
                break
        else:
            return text
    return text


def factorize(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes and distinct values of a string column, in order of first appearance.

    Free for a categorical column. For strings, pandas' default path hashes each string's
    characters (0.8 s for 3 M rows); readers give rows that share a few str objects, whose
    hash Python caches, so an object hash table does the same in a sixth of the time.
    """
    if isinstance(column.dtype, pd.CategoricalDtype):
        codes = column.cat.codes.to_numpy(np.int64)
        return codes, np.asarray(column.cat.categories, dtype=object)
    values = column.to_numpy(dtype=object)
    try:
        from pandas._libs.hashtable import PyObjectHashTable

        uniques, codes = PyObjectHashTable(max(len(values) // 64, 64)).factorize(values)
    except (ImportError, AttributeError, TypeError):  # a pandas without it: the slow path
        codes, uniques = pd.factorize(values)
    return np.asarray(codes, dtype=np.int64), np.asarray(uniques, dtype=object)


def matching(column: pd.Series, predicate: Callable[[str], bool]) -> np.ndarray:
    """Per row, ``predicate(name)``: evaluated once per distinct name, not per row."""
    if not len(column):
        return np.zeros(0, dtype=bool)
    codes, uniques = factorize(column)
    return np.array([bool(predicate(str(name))) for name in uniques], dtype=bool)[codes]
