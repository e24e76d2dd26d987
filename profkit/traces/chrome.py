"""Chrome traces written by torch.profiler (Kineto), ``.json`` or ``.json.gz``, as a Trace.

How Kineto events map to the two tables (see ``profkit.traces.schema``):

- ``ranges`` come from ``user_annotation`` events: every ``record_function`` range,
  hence every ``profkit.phase``/``annotate`` range, with the thread that opened it and its
  nesting depth on that thread. ``ProfilerStep#N`` ranges (the profiler's own, one per
  ``prof.step()``) are left out so that they never become the outermost "phase"; their
  windows are kept in ``meta["profiler_steps"]``. ``gpu_user_annotation`` events are
  ignored: Kineto projects each CPU range onto the GPU by the kernels whose launching
  op it encloses on the same thread, so the backward kernels (launched from autograd
  threads) fall outside ``backward`` there. Attribution works from launches instead.
- ``kernels`` come from ``kernel``, ``gpu_memcpy`` and ``gpu_memset`` events; each is tied
  to its launching ``cuda_runtime``/``cuda_driver`` call through ``args.correlation``,
  which gives ``launch_start`` and ``launch_thread``.
- ``meta["threads"]`` names the threads (``thread 510 (pt_autograd_0)``) and
  ``meta["autograd_threads"]`` lists those that ran ``autograd::engine::evaluate_function``
  ops: what phase inference needs to find the backward pass without phase ranges.

Timestamps: the Trace Event Format's ``ts``/``dur`` are microseconds whatever
``displayTimeUnit`` says (that key only sets the viewer's display). Kineto writes them
as integer nanoseconds divided by 1000 with three decimals, relative to
``baseTimeNanoseconds`` (older traces: absolute, no base). Times here are
``baseTimeNanoseconds + ns(ts)``, with ``ns`` taken from the whole and fractional parts
separately so that no precision is lost multiplying a ~1e12 µs double by 1000;
``end = start + ns(dur)`` so durations are exact to the nanosecond.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from os import PathLike
from pathlib import Path
from typing import Any

import pandas as pd

from profkit.errors import BadInput, warn
from profkit.files import open_tracked_input, read_input, reading
from profkit.sidecar import BrokenSidecar, read_sidecar, validate
from profkit.traces.chrome_stream import CHUNK_BYTES, BrokenJSON, EventBatches, NotStreamable
from profkit.traces.chrome_tables import (
    MAX_BASE_NS,
    Issues,
    kernel_function_name,
    kernels_table,
    ranges_table,
    to_ns,
)
from profkit.traces.columns import Progress
from profkit.traces.schema import Trace

_loads: Callable[[bytes], Any]
try:  # orjson parses large traces several times faster than json, which is the fallback
    import orjson  # (the GPU machine's bare Python may lack it)

    _loads = orjson.loads
    _DECODE_ERRORS: tuple[type[Exception], ...] = (orjson.JSONDecodeError, UnicodeDecodeError)
except ImportError:  # pragma: no cover - orjson is a declared dependency
    import json

    _loads = json.loads
    _DECODE_ERRORS = (json.JSONDecodeError, UnicodeDecodeError)

__all__ = ["FORMAT", "is_chrome_trace", "kernel_function_name", "read_chrome_trace", "to_ns"]

FORMAT = "chrome"
SNIFF_BYTES = 64 * 1024
_GZIP_MAGIC = b"\x1f\x8b"

# What each Kineto event category is to the reader (the capitalised names come from
# older Kineto versions). GPU activities map to their ``kind``; metadata has no category.
_LAUNCH, _RANGE, _META, _OP = "launch", "range", "meta", "op"
# The op autograd runs each backward node in: its thread is autograd's worker (phase
# inference uses it where thread names do not say pt_autograd_N).
AUTOGRAD_OP = "autograd::engine::evaluate_function"
_MALFORMED: Any = object()  # what an event that is not an object, or its odd category, is
_ROLE: dict[Any, str] = {
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
    "cuda_runtime": _LAUNCH,
    "cuda_driver": _LAUNCH,
    "Runtime": _LAUNCH,
    "Driver": _LAUNCH,
    "privateuse1_runtime": _LAUNCH,
    "privateuse1_driver": _LAUNCH,
    "user_annotation": _RANGE,
    "cpu_op": _OP,
    "Operator": _OP,
    None: _META,
}


def is_chrome_trace(path: str | PathLike[str]) -> bool:
    """Whether ``path`` should be read as a Chrome trace (for the reader registry).

    True for names ending in ``.json`` or ``.json.gz`` (the reader then says precisely
    what is wrong with a bad one), and for other files whose first bytes look like a
    trace (``{"traceEvents"...`` or an array of events). Never raises.
    """
    p = Path(path)
    name = p.name.lower()
    if name.endswith((".json", ".json.gz")):
        return True
    try:
        with p.open("rb") as fh:
            head = fh.read(SNIFF_BYTES)
        if head.startswith(_GZIP_MAGIC):
            with gzip.open(p, "rb") as fh:
                head = fh.read(SNIFF_BYTES)
    except (OSError, EOFError, zlib.error):
        return False
    text = head.lstrip()
    return (text.startswith(b"{") and b'"traceEvents"' in text) or (
        text.startswith(b"[") and b'"ph"' in text
    )


def read_chrome_trace(
    path: str | PathLike[str],
    *,
    chunk_bytes: int | None = CHUNK_BYTES,
    progress: Progress | None = None,
) -> Trace:
    """Read a torch.profiler Chrome trace (``.json`` or ``.json.gz``) into a :class:`Trace`.

    The events are parsed ``chunk_bytes`` of JSON at a time (:mod:`.chrome_stream`), so
    memory holds one batch of events, not the document; ``chunk_bytes=None`` parses the
    whole document at once, as the reader did before (the tables are the same; the
    benchmark and the exactness tests compare the two). ``progress(done, size, "bytes")``
    hears, after each read, how many bytes of the file on disk have been consumed
    (compressed bytes for a ``.json.gz``), ending at the file's size.

    Raises :class:`BadInput` (one line) for a missing file or one that is not a regular
    file, truncated or corrupt compression (gzip, xz), invalid JSON, or JSON that is not a
    Chrome trace. Odd events are dropped or fixed and counted, never fatal: one that is
    not an object or lacks a field the tables need, a time that is not finite, a
    category that is not a string; a negative duration counts as 0; ids beyond 64 bits
    become unknown. A trace without GPU activity (a CPU-only run) still returns its
    ranges; every such finding is a line of ``meta["warnings"]``.
    """
    p = Path(path)
    with _gc_paused():
        header, collected = _read_events(p, chunk_bytes, _bytes_read(p, progress))
    base_ns = _int_or(header.get("baseTimeNanoseconds"), 0)
    if not abs(base_ns) < MAX_BASE_NS:
        collected["issues"].add("baseTimeNanoseconds out of range (read as 0)", 1)
        base_ns = 0
    ranges, steps = ranges_table(collected["ranges"], base_ns, collected["issues"])
    kernels = kernels_table(collected["gpu"], collected["launches"], base_ns, collected["issues"])
    meta = _meta(p, header, collected, ranges, kernels, steps)
    meta["sidecar"] = read_sidecar(p)
    return Trace(kernels=kernels, ranges=ranges, meta=meta)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while millions of (acyclic) event dicts are created.

    Each few hundred new containers trigger a collection that walks ever more objects;
    that made ``orjson.loads`` of a 300 MB trace 2.7x slower (docs/PERFORMANCE.md).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _bytes_read(p: Path, progress: Progress | None) -> Callable[[int], None] | None:
    """``report(position)``: ``progress`` in bytes of ``p`` (None when nobody listens)."""
    if progress is None:
        return None
    size = p.stat().st_size
    return lambda done: progress(done, max(size, done), "bytes")


def _read_events(
    p: Path, chunk_bytes: int | None, report: Callable[[int], None] | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The header keys and the collected columns, streaming the events where the layout
    allows (:mod:`.chrome_stream`), else from the whole parsed document. ``report(position)``
    hears where the reading stands in the file on disk after each read."""
    if chunk_bytes is not None:
        try:
            with open_tracked_input(p, "a Chrome trace") as (stream, position), reading(p):
                errors = (*_DECODE_ERRORS, RecursionError)
                on_read = None if report is None else lambda: report(position())
                batches = EventBatches(stream, _loads, errors, chunk_bytes, on_read)
                collected = _collect(chain.from_iterable(batches))
                return batches.header, collected
        except NotStreamable:
            pass  # an odd layout (a top-level array, more after the events): read it whole
        except BrokenJSON as exc:
            raise _invalid_json(p, exc.detail) from None
    doc = _loads_trace(p)
    if report is not None:
        report(p.stat().st_size)  # read whole: every byte of the file
    header, collected = _events_of(p, doc)
    del doc  # the columns are all we keep; free the parsed events before building tables
    return header, collected


def _events_of(p: Path, doc: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        events: list[Any] = doc["traceEvents"]
        header = {k: v for k, v in doc.items() if k != "traceEvents"}
    elif isinstance(doc, list) and any(isinstance(e, dict) and "ph" in e for e in doc[:100]):
        events, header = doc, {}
    else:
        raise BadInput(f"{p} is JSON but not a Chrome trace (no traceEvents list)")
    return header, _collect(events)


def _loads_trace(path: Path) -> Any:
    data = read_input(path, "a Chrome trace")  # .gz / .xz read directly
    if not data.strip():
        raise BadInput(f"{path} is empty, not a Chrome trace")
    if data.lstrip()[:1] not in (b"{", b"["):  # JSON text of a trace opens an object or array
        raise BadInput(f"{path} is not a Chrome trace: {_what_it_starts_with(data)}")
    try:
        return _loads(data)
    except RecursionError:
        raise BadInput(f"{path} is not a Chrome trace: JSON nested too deeply") from None
    except _DECODE_ERRORS as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise _invalid_json(path, detail) from None


def _what_it_starts_with(data: bytes) -> str:
    head = data[:64]
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return f"it holds binary data (first bytes {head[:8].hex(' ')})"
    if "\x00" in text:
        return f"it holds binary data (first bytes {head[:8].hex(' ')})"
    return f"it does not start with a JSON object or array ({text.strip()[:24]!r}...)"


def _invalid_json(path: Path, detail: str) -> BadInput:
    hint = " (truncated?)" if "end of" in detail.lower() or "eof" in detail.lower() else ""
    return BadInput(f"{path} is not valid JSON{hint}: {detail}")


def _collect(events: Iterable[Any]) -> dict[str, Any]:
    """One pass over the events, keeping one tuple per event the tables need.

    Every value of a row is computed before the row is kept, so a malformed event
    (missing ``ts``, non-numeric ``tid``) is dropped alone and counted. Names are
    interned: a trace repeats a few hundred kernel names millions of times.
    """
    ranges: list[tuple[str, float, float, int]] = []
    gpu: list[tuple[str, str, float, float, int, int, int, str, str]] = []
    launches: list[tuple[int, float, int]] = []
    threads: dict[int, str] = {}
    pids: list[int] = []
    autograd_threads: set[int] = set()
    malformed = total = 0
    role_of, intern = _ROLE.get, sys.intern
    for ev in events:
        total += 1
        cat = ev.get("cat") if type(ev) is dict else _MALFORMED  # not an object: malformed
        # A category that is a list or a number is no category: malformed too.
        role = role_of(cat) if cat is None or type(cat) is str else _MALFORMED
        if role is None or role is _MALFORMED:
            malformed += role is _MALFORMED
            continue
        try:  # the frequent roles inline: this loop sees every event of the trace
            if role == _LAUNCH:
                corr = ev["args"].get("correlation")
                if corr is not None:
                    launches.append((int(corr), float(ev["ts"]), int(ev["tid"])))
            elif role == _RANGE:
                if ev.get("ph") == "X":
                    name = intern(str(ev["name"]))
                    ranges.append((name, float(ev["ts"]), float(ev["dur"]), int(ev["tid"])))
            elif role == _OP:
                if str(ev.get("name", "")).startswith(AUTOGRAD_OP):
                    autograd_threads.add(int(ev["tid"]))
            elif role == _META:
                _metadata_event(ev, threads, pids)
            else:
                gpu.append(_gpu_row(ev, role))
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError):  # int(inf)
            malformed += 1
    return {
        "ranges": _columns(ranges, 4),
        "gpu": _columns(gpu, 9),
        "launches": _columns(launches, 3),
        "threads": threads,
        "pid": pids[-1] if pids else None,
        "autograd_threads": sorted(autograd_threads),
        "malformed": malformed,
        "events": total,
        "issues": Issues(),
    }


def _metadata_event(ev: dict[str, Any], threads: dict[int, str], pids: list[int]) -> None:
    """Thread names, and the OS process id (GPU lanes use device numbers), from ``ph: M``."""
    if ev.get("ph") == "M" and ev.get("name") == "thread_name":
        threads[int(ev["tid"])] = str((ev.get("args") or {}).get("name", ""))
    elif ev.get("name") == "process_labels" and _is_cpu(ev):
        pids.append(int(ev["pid"]))


def _gpu_row(
    ev: dict[str, Any], kind: str
) -> tuple[str, str, float, float, int, int, int, str, str]:
    """A kernel, copy or set: name, kind, ts, dur, device, stream, correlation, grid, block."""
    args = ev.get("args") or {}
    return (
        sys.intern(str(ev.get("name", ""))),
        kind,
        float(ev["ts"]),
        float(ev["dur"]),
        int(args["device"] if "device" in args else ev.get("pid", 0)),
        _int_or(args.get("stream", ev.get("tid")), -1),
        _int_or(args.get("correlation"), -1),
        _dim3(args.get("grid")),
        _dim3(args.get("block")),
    )


def _columns(rows: list[tuple[Any, ...]], width: int) -> tuple[list[Any], ...]:
    """Rows to columns (``width`` empty columns when there are no rows)."""
    if not rows:
        return tuple([] for _ in range(width))
    return tuple(list(column) for column in zip(*rows, strict=True))


def _is_cpu(ev: dict[str, Any]) -> bool:
    return (ev.get("args") or {}).get("labels") == "CPU"


def _int_or(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # None, "abc", nan, inf
        return default


def _dim3(value: Any) -> str:
    if isinstance(value, list | tuple):
        return sys.intern(",".join(str(int(v)) for v in value))
    return ""


def _meta(
    path: Path,
    header: dict[str, Any],
    collected: dict[str, Any],
    ranges: pd.DataFrame,
    kernels: pd.DataFrame,
    steps: list[dict[str, Any]],
) -> dict[str, Any]:
    warnings: list[str] = []
    if kernels.empty:
        warnings.append(
            "no GPU kernels were recorded (a CPU-only run, or CUDA activity not profiled): "
            "only the CPU ranges are available"
        )
    else:
        unlaunched = int(kernels["launch_start"].isna().sum())
        if unlaunched:
            warnings.append(
                f"{unlaunched:,} of {len(kernels):,} GPU activities have no matching "
                "runtime/driver launch (correlation id); they stay unattributed"
            )
    if ranges.empty:
        warnings.append(
            "no record_function ranges: kernels cannot be attributed to phases "
            "(wrap the step's parts in profkit.phase(...))"
        )
    if collected["malformed"]:
        warnings.append(f"skipped {collected['malformed']:,} malformed events")
    for reason, count in collected["issues"].items():
        warnings.append(f"{count:,} events with a {reason}")
    devices = header.get("deviceProperties")
    devices = devices if isinstance(devices, list) else []
    meta: dict[str, Any] = {
        "path": str(path),
        "format": FORMAT,
        "events": collected["events"],
        "gpus": [d.get("name") for d in devices if isinstance(d, dict)],
        "threads": collected["threads"],
        "pid": collected["pid"],
        "autograd_threads": collected["autograd_threads"],
        "profiler_steps": steps,
        "base_time_ns": _int_or(header.get("baseTimeNanoseconds"), 0),
        "display_time_unit": header.get("displayTimeUnit"),
        "warnings": warnings,
        "dropped_events": collected["malformed"]
        + collected["issues"].get("non-finite or out-of-range time", 0),
        "clamped_activities": collected["issues"].get("negative duration (counted as 0)", 0),
    }
    for key in ("schemaVersion", "trace_id", "cuda_runtime_version", "cuda_driver_version",
                "cupti_version", "record_shapes", "with_stack", "profile_memory",
                "distributedInfo"):  # fmt: skip
        if key in header:
            meta[key] = header[key]
    meta.update(_profkit_record(path, header.get("profkit")))
    return meta


def _profkit_record(path: Path, profkit: Any) -> dict[str, Any]:
    """What ``profkit torch`` adds to the header (command, version, config), if it is sound.

    Checked like a sidecar: a broken record costs only its extras, with one warning.
    """
    if not isinstance(profkit, dict):
        return {}
    try:
        validate({"config": profkit.get("config")})
    except BrokenSidecar as exc:
        warn(f"ignored the profkit record in {path}: {exc}")
        return {}
    config = profkit.get("config")
    return {"profkit": profkit, **({"config": config} if isinstance(config, dict) else {})}


def _register() -> None:
    from profkit.traces.load import register

    for suffix in (".json", ".json.gz"):
        register(suffix, read_chrome_trace, reports_progress=True)


_register()
