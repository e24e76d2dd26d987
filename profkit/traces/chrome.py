"""Chrome traces written by torch.profiler (Kineto), ``.json`` or ``.json.gz``, read once.

The reader owns the pass over a trace's events: the file (streamed a batch of events at
a time by :mod:`.chrome_json`, or parsed whole where its layout asks), the header and
the meta, the validations, and what each event is to the tables. Its result is compact
columns (:func:`read_chrome_columns`, what ``load_columns`` reads): the GPU activities
gathered as arrays batch by batch (:mod:`.chrome_activities`), the ranges as a table.

How Kineto events map to the columns (see ``profkit.traces.columns``):

- ``ranges`` come from ``user_annotation`` events: every ``record_function`` range,
  hence every ``profkit.phase``/``annotate`` range, with the thread that opened it and its
  nesting depth on that thread. ``ProfilerStep#N`` ranges (the profiler's own, one per
  ``prof.step()``) are left out so that they never become the outermost "phase"; their
  windows are kept in ``meta["profiler_steps"]``. ``gpu_user_annotation`` events are
  ignored: Kineto projects each CPU range onto the GPU by the kernels whose launching
  op it encloses on the same thread, so the backward kernels (launched from autograd
  threads) fall outside ``backward`` there. Attribution works from launches instead.
- the activities come from ``kernel``, ``gpu_memcpy`` and ``gpu_memset`` events; each is tied
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
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from profkit.errors import BadInput, warn
from profkit.files import open_tracked_input, read_input, reading
from profkit.sidecar import BrokenSidecar, read_sidecar, validate
from profkit.traces.chrome_activities import (
    Activities,
    ActivityArrays,
    GpuBatch,
    columns_of,
)
from profkit.traces.chrome_fields import (
    MAX_BASE_NS,
    NEGATIVE,
    NON_FINITE,
    Issues,
    kernel_function_name,
    ranges_table,
    to_ns,
)
from profkit.traces.chrome_json import CHUNK_BYTES, BrokenJSON, EventBatches, NotStreamable
from profkit.traces.columns import ActivityColumns, Progress
from profkit.traces.host_trace import ChromeHostRows, keep_host
from profkit.traces.ranks import rank_of_meta
from profkit.traces.schema import check_span

T = TypeVar("T")

_loads: Callable[[bytes], Any]
try:  # orjson parses large traces several times faster than json, which is the fallback
    import orjson  # (the GPU machine's bare Python may lack it)

    _loads = orjson.loads
    _DECODE_ERRORS: tuple[type[Exception], ...] = (orjson.JSONDecodeError, UnicodeDecodeError)
except ImportError:  # pragma: no cover - orjson is a declared dependency
    import json

    _loads = json.loads
    _DECODE_ERRORS = (json.JSONDecodeError, UnicodeDecodeError)

__all__ = [
    "FORMAT",
    "is_chrome_trace",
    "kernel_function_name",
    "read_chrome_columns",
    "to_ns",
]

FORMAT = "chrome"
SNIFF_BYTES = 64 * 1024
WHOLE_BATCH_EVENTS = 1 << 14  # a whole document's events are passed over this many at a time
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


def read_chrome_columns(
    path: str | PathLike[str],
    *,
    chunk_bytes: int | None = CHUNK_BYTES,
    progress: Progress | None = None,
) -> ActivityColumns:
    """Read a torch.profiler Chrome trace (``.json`` or ``.json.gz``) as compact columns.

    The document is parsed once, ``chunk_bytes`` of JSON at a time (:mod:`.chrome_json`),
    so memory holds one batch of events and a few numbers per GPU activity, never the
    document nor a row object per activity; ``chunk_bytes=None`` parses the whole
    document at once (the columns are the same; the exactness tests compare the two).
    ``progress(done, size, "bytes")`` hears, after each read, how many bytes of the file
    on disk have been consumed (compressed bytes for a ``.json.gz``), ending at its size.

    A trace that names its rank (``distributedInfo``, or profkit's header) keeps each
    activity's GPU start and device (:data:`~profkit.traces.columns.TIMED`): joined to
    the other ranks' its columns give the ranked report
    (:mod:`profkit.analysis.joins`).

    Raises :class:`BadInput` (one line) for a missing file or one that is not a regular
    file, truncated or corrupt compression (gzip, xz), invalid JSON, JSON that is not a
    Chrome trace, and timestamps spanning more than
    :data:`~profkit.traces.schema.MAX_SPAN_NS`. Odd events are dropped or fixed and
    counted, never fatal: one that is not an object or lacks a field the columns need, a
    time that is not finite, a category that is not a string; a negative duration counts
    as 0; ids beyond 64 bits become unknown. A trace without GPU activity (a CPU-only run)
    still returns its ranges; every such finding is a line of ``meta["warnings"]``.
    """
    p = Path(path)
    read = _read(p, chunk_bytes, progress)
    _check_span(read)
    timed = rank_of_meta(read.meta) is not None
    columns = columns_of(read.activities, read.ranges, read.meta, timed)
    # What the findings read of the events, read in the same pass: kept with the columns
    # (and so in the cache), the JSON is not parsed again for them
    keep_host(columns, read.host.trace(p, columns.meta))
    return columns


@dataclass
class _Read:
    activities: Activities
    ranges: pd.DataFrame
    meta: dict[str, Any]
    host: ChromeHostRows


def _read(p: Path, chunk_bytes: int | None, progress: Progress | None) -> _Read:
    """The one pass over the events, then the ranges table, the activities in order and
    the meta."""
    with _gc_paused():
        header, collected, gathered, host = _read_events(p, chunk_bytes, _bytes_read(p, progress))
    base_ns = _int_or(header.get("baseTimeNanoseconds"), 0)
    if not abs(base_ns) < MAX_BASE_NS:
        collected["issues"].add("baseTimeNanoseconds out of range (read as 0)", 1)
        base_ns = 0
    # The ranges first, then the activities: their issues are warned of in that order.
    ranges, steps = ranges_table(collected.pop("ranges"), base_ns, collected["issues"])
    activities = gathered.finish(base_ns, collected["issues"])
    meta = _meta(p, header, collected, ranges, activities, steps)
    meta["base_time_ns"] = base_ns  # the base the times were read with (0 for one out of range)
    meta["sidecar"] = read_sidecar(p)
    return _Read(activities, ranges, meta, host)


def _check_span(read: _Read) -> None:
    """The activities' times and the ranges' within ``MAX_SPAN_NS`` of each other."""
    bounds = [read.activities.bounds()]
    for column in ("start", "end"):
        values = read.ranges[column].to_numpy(np.int64)
        bounds.append((int(values.min()), int(values.max())) if len(values) else None)
    known = [b for b in bounds if b is not None]
    if known:
        low, high = min(lo for lo, _ in known), max(hi for _, hi in known)
        check_span(low, high, read.meta.get("path", "the trace"))


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
    p: Path,
    chunk_bytes: int | None,
    report: Callable[[int], None] | None,
) -> tuple[dict[str, Any], dict[str, Any], ActivityArrays, ChromeHostRows]:
    """The header keys, what the pass kept, the GPU activities gathered and the host
    rows the findings read (:func:`over_events`)."""

    def collect(
        batches: Iterable[list[Any]],
    ) -> tuple[dict[str, Any], ActivityArrays, ChromeHostRows]:
        # anew for each try: what a failed stream kept is dropped
        activities, host = ActivityArrays(), ChromeHostRows()

        def seen(batches: Iterable[list[Any]]) -> Iterator[list[Any]]:
            for events in batches:
                host.add(events)
                yield events

        return _collect(seen(batches), activities), activities, host

    header, (collected, activities, host) = over_events(p, collect, chunk_bytes, report)
    return header, collected, activities, host


def over_events(
    p: Path,
    collect: Callable[[Iterable[list[Any]]], T],
    chunk_bytes: int | None = CHUNK_BYTES,
    report: Callable[[int], None] | None = None,
) -> tuple[dict[str, Any], T]:
    """The header keys and ``collect(batches)`` over a Chrome trace's events, a batch at
    a time, streaming them where the layout allows (:mod:`.chrome_json`), else from the
    whole parsed document (``collect`` then runs anew; ``chunk_bytes=None``: at once).
    ``report(position)`` hears where the reading stands in the file on disk after each
    read."""
    if chunk_bytes is not None:
        try:
            with open_tracked_input(p, "a Chrome trace") as (stream, position), reading(p):
                errors = (*_DECODE_ERRORS, RecursionError)
                on_read = None if report is None else lambda: report(position())
                batches = EventBatches(stream, _loads, errors, chunk_bytes, on_read)
                kept = collect(batches)
                return batches.header, kept
        except NotStreamable:
            pass  # an odd layout (a top-level array, more after the events): read it whole
        except BrokenJSON as exc:
            raise _invalid_json(p, exc.detail) from None
    doc = _loads_trace(p)
    if report is not None:
        report(p.stat().st_size)  # read whole: every byte of the file
    header, events = _events_of(p, doc)
    del doc  # the events alone are needed, a batch at a time
    return header, collect(_slices(events))


def _events_of(p: Path, doc: Any) -> tuple[dict[str, Any], list[Any]]:
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        events: list[Any] = doc["traceEvents"]
        header = {k: v for k, v in doc.items() if k != "traceEvents"}
    elif isinstance(doc, list) and any(isinstance(e, dict) and "ph" in e for e in doc[:100]):
        events, header = doc, {}
    else:
        raise BadInput(f"{p} is JSON but not a Chrome trace (no traceEvents list)")
    return header, events


def _slices(events: list[Any]) -> Iterator[list[Any]]:
    """A whole document's events in batches, as the stream gives them (bounded lists)."""
    for start in range(0, len(events), WHOLE_BATCH_EVENTS):
        yield events[start : start + WHOLE_BATCH_EVENTS]


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


def _collect(batches: Iterable[list[Any]], activities: ActivityArrays) -> dict[str, Any]:
    """One pass over the events, a batch at a time: the GPU activities and their launch
    calls go to ``activities`` (arrays, batch by batch), the rest is kept here.

    Every value an event gives is computed before any is kept, so a malformed event
    (missing ``ts``, non-numeric ``tid``) is dropped alone and counted. Range names are
    interned, activity names coded: a trace repeats a few hundred names millions of times.
    """
    ranges: list[tuple[str, float, float, int]] = []
    threads: dict[int, str] = {}
    pids: list[int] = []
    autograd_threads: set[int] = set()
    malformed = total = 0
    role_of, intern = _ROLE.get, sys.intern
    codes, name_code, shape_code = activities.codes, activities.name_code, activities.shape_code
    for events in batches:
        gpu = GpuBatch.empty()
        pair, ts_of, dur_of, device_of = gpu.pair, gpu.ts, gpu.dur, gpu.device
        corr_of, shape_of = gpu.correlation, gpu.shape
        launch_corr, launch_ts, launch_tid = (
            gpu.launch_correlation,
            gpu.launch_ts,
            gpu.launch_thread,
        )
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
                        corr, ts, tid = int(corr), float(ev["ts"]), int(ev["tid"])
                        launch_corr.append(corr)
                        launch_ts.append(ts)
                        launch_tid.append(tid)
                elif role == _RANGE:
                    if ev.get("ph") == "X":
                        name = intern(str(ev["name"]))
                        ranges.append((name, float(ev["ts"]), float(ev["dur"]), int(ev["tid"])))
                elif role == _OP:
                    if str(ev.get("name", "")).startswith(AUTOGRAD_OP):
                        autograd_threads.add(int(ev["tid"]))
                elif role == _META:
                    _metadata_event(ev, threads, pids)
                else:  # a kernel, copy or set
                    args = ev.get("args") or {}
                    ts, dur = float(ev["ts"]), float(ev["dur"])
                    device = int(args["device"] if "device" in args else ev.get("pid", 0))
                    corr = _int_or(args.get("correlation"), -1)
                    shape = shape_code(args.get("grid"), args.get("block"))
                    name = ev.get("name", "")
                    code = codes[role].get(name) if type(name) is str else None
                    if code is None:
                        code = name_code(name, role)  # last: raises for no kept event
                    pair.append(code)
                    ts_of.append(ts)
                    dur_of.append(dur)
                    device_of.append(device)
                    corr_of.append(corr)
                    shape_of.append(shape)
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError):  # int(inf)
                malformed += 1
        activities.add(gpu)
    return {
        "ranges": _columns(ranges, 4),
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


def _meta(
    path: Path,
    header: dict[str, Any],
    collected: dict[str, Any],
    ranges: pd.DataFrame,
    activities: Activities,
    steps: list[dict[str, Any]],
) -> dict[str, Any]:
    warnings: list[str] = []
    if not len(activities):
        warnings.append(
            "no GPU kernels were recorded (a CPU-only run, or CUDA activity not profiled): "
            "only the CPU ranges are available"
        )
    else:
        unlaunched = activities.unlaunched()
        if unlaunched:
            warnings.append(
                f"{unlaunched:,} of {len(activities):,} GPU activities have no matching "
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
        "dropped_events": collected["malformed"] + collected["issues"].get(NON_FINITE, 0),
        "clamped_activities": collected["issues"].get(NEGATIVE, 0),
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
        register(suffix, read_chrome_columns)


_register()
