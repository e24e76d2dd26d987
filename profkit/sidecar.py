"""The sidecar ``NAME.profkit.json``: what profkit knew about a run, beside its artefact.

``profkit nsys`` writes one beside ``NAME.sqlite`` / ``NAME.nsys-rep``, ``profkit memory``
beside ``NAME.pickle``; readers use it for extras only (the workload config, Python phase
times, the allocator's own peak counters, phase marks). This module is the one place that
names, writes, reads and validates it, so every caller reacts the same way to a broken
one: a sidecar that is missing is None; one that is unreadable, not JSON, or has a value
of the wrong type where profkit reads it (``ctx: "abc"``, ``config`` a list, ``batch:
1e400``) is ignored whole, with one warning line, and the analysis goes on without it.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from profkit.errors import warn
from profkit.files import COMPRESSION_SUFFIXES, SIDECAR_SUFFIX

SUFFIX = SIDECAR_SUFFIX
# What an artefact's name may end in; the sidecar replaces all of it (compression too).
ARTEFACT_SUFFIXES = (".pickle", ".sqlite", ".sqlite3", ".nsys-rep", ".qdrep", ".json", ".db")
MAX_BYTES = 16 << 20  # a sidecar is a few KiB; anything this big is not one
_MAX_COUNT = 1 << 53  # whole numbers past this are not sizes, steps or bytes anyone has

# The fields profkit reads, with the type each must have; other fields are kept unread.
# "count" is a whole number >= 0 (>= 1 for "count+"), "number" any finite number,
# (spec,) a list of spec, a dict a mapping with these optional keys, ("map", spec) a
# mapping whose every value is spec; "?" after a spec allows null.
_CONFIG = {
    "size": "str", "ctx": "count+", "batch": "count+", "mode": "str", "dtype": "str",
    "compile": "bool", "attention": "str", "warmup": "count", "steps": "count",
    "device": "str", "vocab_size": "count+", "seed": "count", "extra": ("map", "any"),
}  # fmt: skip
_STEPS = (("map", "number?"),)
_SCHEMA: dict[str, Any] = {
    "name": "str",
    "config": (_CONFIG, "?"),
    "program": (("str",), "?"),
    "status": "str?",
    "error": "str?",
    "result": (
        {"config": (_CONFIG, "?"), "status": "str?", "steps": _STEPS, "warmup_steps": _STEPS},
        "?",
    ),
    "phase_marks": ({"phase": "str", "time_us": "number?", "monotonic_us": "number?"},),
    "capture": (("map", "scalar"), "?"),
    "timings_s": ("map", "number?"),
    "nsys": ({"argv": ("str",), "version": "str?"}, "?"),
    "files": (("map", "str"), "?"),
}


_ROOT = "the sidecar"


class BrokenSidecar(ValueError):
    """Where a sidecar (or a record of the same shape) breaks the schema; names the field."""


def sidecar_path(artefact: Path | str) -> Path:
    """``run.sqlite``, ``run.nsys-rep``, ``run.pickle.xz``, ``run.json.gz`` -> ``run.profkit.json``."""
    artefact = Path(artefact)
    name = artefact.name
    for suffix in COMPRESSION_SUFFIXES:
        name = name.removesuffix(suffix)
    for suffix in ARTEFACT_SUFFIXES:
        if name.endswith(suffix) and name != suffix:
            return artefact.with_name(name.removesuffix(suffix) + SUFFIX)
    return artefact.with_name(Path(name).stem + SUFFIX)


def write_sidecar(path: Path | str, record: Mapping[str, Any]) -> Path:
    """Write ``record`` to the sidecar file ``path`` atomically; return ``path``.

    A reader never sees half a file (it is written beside and renamed); non-finite floats
    become null, since JSON has no NaN and readers would refuse the file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(_finite(record), indent=2, default=str) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_sidecar(artefact: Path | str) -> dict[str, Any] | None:
    """The validated sidecar beside ``artefact``; None when there is none or it is broken.

    A broken sidecar is said in one warning line (:func:`profkit.errors.warn`).
    """
    path = sidecar_path(artefact)
    try:
        return load_sidecar(path)
    except BrokenSidecar as exc:
        warn(f"ignored {path}: {exc}; the analysis goes on without its extras")
        return None


def load_sidecar(path: Path) -> dict[str, Any] | None:
    """Read and validate the sidecar file ``path`` (None if absent); raises :class:`BrokenSidecar`."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BrokenSidecar(exc.strerror or str(exc)) from None
    if not stat.S_ISREG(info.st_mode):
        raise BrokenSidecar("not a regular file")
    if info.st_size > MAX_BYTES:
        raise BrokenSidecar(f"{info.st_size:,} bytes is too big for a sidecar")
    try:
        value = json.loads(path.read_bytes(), parse_constant=_no_constant)
    except (OSError, ValueError, RecursionError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BrokenSidecar(f"not valid JSON ({detail})") from None
    validate(value)
    return value  # type: ignore[no-any-return]


def validate(record: Any) -> None:
    """Raise :class:`BrokenSidecar` unless ``record`` has the types profkit reads."""
    try:
        _check_finite(record, _ROOT)  # extras are passed on: none may be inf/nan
        _check(record, _SCHEMA, _ROOT)
    except RecursionError:
        raise BrokenSidecar("nested too deeply") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _check(value: Any, spec: Any, where: str) -> None:
    if isinstance(spec, tuple) and spec[-1:] == ("?",):
        if value is not None:
            _check(value, spec[0], where)
    elif isinstance(spec, str):
        if spec.endswith("?"):
            _check(value, (spec[:-1], "?"), where)
        else:
            _scalar(value, spec, where)
    elif isinstance(spec, dict):
        if not isinstance(value, dict):
            raise BrokenSidecar(f"{where} is {_show(value)}, not an object")
        for key, inner in spec.items():
            if key in value:
                _check(value[key], inner, _field(where, key))
    elif spec[0] == "map":
        if not isinstance(value, dict):
            raise BrokenSidecar(f"{where} is {_show(value)}, not an object")
        for key, inner in value.items():
            _check(inner, spec[1], f"{where}.{key}")
    else:  # (spec,): a list
        if not isinstance(value, list):
            raise BrokenSidecar(f"{where} is {_show(value)}, not a list")
        for index, item in enumerate(value):
            _check(item, spec[0], f"{where}[{index}]")


def _scalar(value: Any, kind: str, where: str) -> None:
    if kind == "any":
        _check_finite(value, where)
        return
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    ok = {
        "str": isinstance(value, str),
        "bool": isinstance(value, bool),
        "number": is_number and math.isfinite(value),
        "count": isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MAX_COUNT,
        "count+": isinstance(value, int) and not isinstance(value, bool) and 0 < value < _MAX_COUNT,
        "scalar": value is None
        or isinstance(value, str | bool)
        or (is_number and math.isfinite(value)),
    }[kind]
    if not ok:
        wanted = {
            "str": "text",
            "bool": "true or false",
            "number": "a finite number",
            "count": "a whole number >= 0",
            "count+": "a whole number >= 1",
            "scalar": "a finite number, text, true/false or null",
        }[kind]
        raise BrokenSidecar(f"{where} is {_show(value)}, not {wanted}")


def _check_finite(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise BrokenSidecar(f"{where} is {value}, not a finite number")
    if isinstance(value, dict):
        for key, inner in value.items():
            _check_finite(inner, _field(where, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            _check_finite(inner, f"{where}[{index}]")


def _field(where: str, key: str) -> str:
    return key if where == _ROOT else f"{where}.{key}"


def _show(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {key: _finite(inner) for key, inner in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(inner) for inner in value]
    return value
