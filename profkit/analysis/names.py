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
import re
from collections.abc import Callable

import numpy as np
import pandas as pd

MAX_CHARS = 80

_CASTS = re.compile(r"\((?:unsigned |signed )?(?:int|long long|long|short|char|bool)\)")
_LAMBDA = re.compile(r"::\[lambda[^\]]*\]")
_OPERATOR_CALL = re.compile(r"::operator \(\)\(\)(?: const)?")
_PARENS = re.compile(r"\([^()]*\)")
_NAMESPACE = re.compile(r"\b[A-Za-z_]\w*::")
_STD_ARRAY = re.compile(r",\s*array<char \*, \d+>")
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
    text = _CASTS.sub("", text)
    text = _LAMBDA.sub("", text)
    text = _OPERATOR_CALL.sub("", text)
    previous = None
    while previous != text:  # innermost parentheses first: nested parameter lists
        previous, text = text, _PARENS.sub("", text)
    text = _NAMESPACE.sub("", text)
    text = re.sub(r"\bvoid ", "", text)
    text = _STD_ARRAY.sub("", text)
    for wrapper in _WRAPPERS:
        text = _unwrap(text, wrapper)
    text = _REPEATS.sub(r"\1", text)
    text = _SPACES.sub(" ", text).strip()
    if len(text) > max_chars:
        text = text[: max_chars - 1].rstrip(", <") + "…"
    return text


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
