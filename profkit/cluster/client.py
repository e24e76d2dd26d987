"""A job's files read on Dask workers: ``--workers N`` (a local cluster of N processes) or
``--scheduler ADDRESS|SCHEDULER_FILE`` (an existing cluster).

The map is one task per file (:func:`profkit.cluster.tasks.file_part`), run where the
file lies; the client gathers the parts as they finish, in the order given, and merges
them (:func:`profkit.traces.job.together`, then :mod:`profkit.analysis.node_parts`). Dask
keeps a task whose worker died and runs it again elsewhere, so a part is either whole or
not there: a task that keeps failing (:data:`ALLOWED_FAILURES`) ends the command with one
line naming its file, as does a file a worker cannot read. Dask is an optional extra
(``pip install 'profkit[dask]'``); without it the flags say how to install it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from profkit.errors import DASK_INSTALL, BadInput

T = TypeVar("T")
CONNECT_TIMEOUT_S = 10
"""How long the client tries to reach a scheduler before it says it cannot."""
CLOSING_THREAD = "profkit-dask-close"
"""The name of the thread that closes a local cluster after the map (beside the reduce)."""
ALLOWED_FAILURES = 3
"""Times a file's task may lose its worker before the read gives up (Dask's own default)."""


def check_flags(workers: int | None, scheduler: str | None) -> None:
    """One line for flags that cannot both hold, or a worker count below one."""
    if workers is not None and scheduler is not None:
        raise BadInput(
            "give --workers (a local cluster) or --scheduler (an existing one), not both"
        )
    if workers is not None and workers < 1:
        raise BadInput(f"--workers must be at least 1; got {workers}")


@contextmanager
def dask_client(workers: int | None, scheduler: str | None) -> Iterator[Any]:
    """A ``distributed.Client``: of a local cluster of ``workers`` processes, or connected to
    ``scheduler`` (an address such as ``tcp://10.0.0.1:8786``, or a scheduler file). Closed
    on exit (the local cluster's processes with it)."""
    check_flags(workers, scheduler)
    try:
        import distributed
    except ImportError:
        flag = "--workers" if scheduler is None else "--scheduler"
        raise BadInput(f"{flag} runs on Dask, which is not installed: {DASK_INSTALL}") from None
    import dask

    quiet = logging.getLogger("distributed")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # a worker lost and restarted is said by the result
    closing = None
    try:
        with dask.config.set({"distributed.scheduler.allowed-failures": ALLOWED_FAILURES}):
            if scheduler is None:
                # No dashboard; its HTTP server (always started) on a free port, not on
                # 8787, which another cluster may hold (Dask then warns). The workers say
                # nothing: a task's failure comes back with its result, and closing the
                # cluster beside the reduce can log a heartbeat's traceback otherwise
                cluster = distributed.LocalCluster(
                    n_workers=workers, threads_per_worker=1, processes=True,
                    dashboard_address=None, scheduler_kwargs={"dashboard_address": ":0"},
                    silence_logs=logging.CRITICAL,
                )  # fmt: skip
                try:
                    with distributed.Client(cluster) as client:
                        yield client
                finally:
                    # The workers' processes take seconds to end (15 of them: several);
                    # the client's own work goes on meanwhile, and the interpreter waits
                    # for them before it exits (the thread is not a daemon)
                    closing = threading.Thread(
                        target=_close, args=(cluster, quiet, level), name=CLOSING_THREAD
                    )
                    closing.start()
            else:
                with _connected(distributed, scheduler) as client:
                    yield client
    finally:
        if closing is None:
            quiet.setLevel(level)


def _close(cluster: Any, quiet: logging.Logger, level: int) -> None:
    """Close a local cluster (its workers' processes with it), then let Dask speak again."""
    try:
        cluster.close()
    finally:
        quiet.setLevel(level)


@contextmanager
def _connected(distributed: Any, scheduler: str) -> Iterator[Any]:
    """A client of the scheduler at ``scheduler`` (address or scheduler file), or one line."""
    kwargs: dict[str, Any] = {"timeout": f"{CONNECT_TIMEOUT_S}s"}
    if Path(scheduler).is_file():
        kwargs["scheduler_file"] = scheduler
    elif "://" in scheduler or ":" in scheduler:
        kwargs["address"] = scheduler
    else:
        raise BadInput(
            f"--scheduler {scheduler!r} is neither a scheduler file nor an address "
            "(tcp://HOST:PORT)"
        )
    try:
        client = distributed.Client(**kwargs)
    except (OSError, TimeoutError, ValueError) as exc:
        raise BadInput(f"cannot reach the Dask scheduler at {scheduler}: {_said(exc)}") from None
    with client:
        yield client


def map_files(
    client: Any,
    fn: Callable[..., T],
    paths: Sequence[Path],
    done: Callable[[int, int], None] | None = None,
    **kwargs: Any,
) -> list[T]:
    """``fn(path, **kwargs)`` of each path on the client's workers, in the order given;
    ``done(finished, total)`` after each. A relative path goes joined to this process's
    working directory (:func:`as_given` undoes it): a worker has its own, and on a shared
    filesystem an absolute path names the same file on every host. A task that raised
    re-raises its error here (a :class:`BadInput` is the file's one line); one whose
    workers kept dying is one line naming the file."""
    from distributed import as_completed
    from distributed.scheduler import KilledWorker

    here = Path.cwd()  # a worker's is another: each path goes as this process opens it
    futures = [client.submit(fn, str(here / p), key=f"profkit-read-{i}-{p.name}", pure=False,
                             **kwargs) for i, p in enumerate(paths)]  # fmt: skip
    index = {f.key: i for i, f in enumerate(futures)}
    results: list[Any] = [None] * len(futures)
    # Each result is fetched and unpickled as its task ends, beside the others (not one
    # round trip after another on this thread)
    arriving = as_completed(futures, with_results=True, raise_errors=False)
    try:
        for finished, (future, result) in enumerate(arriving, start=1):
            path = paths[index[future.key]]
            if future.status == "error":
                _, exc, traceback = result
                if isinstance(exc, KilledWorker):
                    raise BadInput(
                        f"{path}: its read lost {ALLOWED_FAILURES + 1} Dask workers in a row "
                        "(out of memory, or killed); nothing of a partial job is reported"
                    ) from None
                if isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError):
                    raise BadInput(f"{path}: a worker cannot read it: {exc}") from None
                raise exc.with_traceback(traceback)
            if future.status != "finished":  # cancelled on the cluster (its client, a restart)
                raise BadInput(
                    f"{path}: its task was {future.status} on the Dask cluster; nothing of "
                    "a partial job is reported"
                )
            results[index[future.key]] = result
            if done is not None:
                done(finished, len(futures))
    finally:
        client.cancel([f for f in futures if not f.done()])
    return results


def as_given(path: str, given: Path) -> str:
    """A path a worker wrote of the file sent as ``given`` (the file's, or one made beside
    it: a report's export), as the user wrote ``given``: relative again where it was."""
    if given.is_absolute():
        return path
    here = str(Path.cwd()) + os.sep
    return path[len(here) :] if path.startswith(here) else path


def _said(exc: BaseException) -> str:
    """An exception's own words on one line."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]
