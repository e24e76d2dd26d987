"""Running an external command as one process tree that can be ended as a whole.

Profilers wrap the program they profile (``nsys profile python ...``) and may move it out
of their process group: nsys 2025.3 starts it in a session of its own (seen on the H100),
so ending only the child's group would leave the real workload running and holding the GPU. :func:`kill_tree` ends every descendant too; :func:`run_logged`
runs a command in its own session with its whole output saved to a log file (and echoed,
if asked), and ends the tree on Ctrl-C or timeout.

A child must also die when its parent is killed outright (SIGKILL, the OOM killer), which
no handler in the parent can see. Every child profkit starts gets ``PR_SET_PDEATHSIG``
(:func:`die_with_parent`, Linux: the kernel sends SIGKILL when the parent dies), and
profkit's own children also watch the sweep's pid (:func:`watch_parent`), which covers a
child that a wrapper such as nsys started, out of the kernel's reach. Temporary
directories are named after their owner's pid (:func:`private_tempdir`): SIGINT and
SIGTERM remove them on the way out; after a SIGKILL the child that notices removes its
own, and the next run removes any whose owner is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from profkit.errors import BadInput, MissingTool
from profkit.workload.config import MULTICAST_OFF

TAIL_CHARS = 4_000
_ERROR_WORDS = re.compile(
    r"error|unrecogni[sz]ed|not found|no such|failed|invalid|denied|exception|killed",
    re.IGNORECASE,
)


PARENT_PID_ENV = "PROFKIT_PARENT_PID"
"""The pid of the profkit process a child works for; the child exits when it is gone."""
WATCH_INTERVAL_S = 0.25
_PR_SET_PDEATHSIG = 1
_TEMP_NAME = re.compile(r"^profkit-(?:[a-z]+-)?(\d+)-")


def _load_prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, from the libraries this process has loaded already.

    Not through ``ctypes.util.find_library``: that runs ``ldconfig -p`` in a subprocess,
    and while a process spawns one, every signal is blocked in it for a moment. A child
    importing this module then showed SIGTERM blocked before :func:`watch_parent` had armed
    anything, and a parent killed at that moment left its temporary directory behind
    (tests/test_kill.py, about one run in 20).
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


# Looked up now, in the parent: a preexec function must not load libraries after fork.
_PRCTL = _load_prctl()


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux only)."""
    return _PRCTL is not None and _PRCTL(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def die_with_parent() -> Callable[[], None]:
    """A ``preexec_fn`` for Popen: the child gets SIGKILL when this process dies.

    If this process died between fork and the prctl call, the child exits at once.
    """
    parent = os.getpid()

    def preexec() -> None:
        set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of every child: ours, ``env`` on top, our pid for :func:`watch_parent`,
    and NVLink multicast off unless the user set those variables (it can take a shared
    host's GPUs out of service)."""
    merged = {**os.environ, **(env or {}), PARENT_PID_ENV: str(os.getpid())}
    for key, value in MULTICAST_OFF.items():
        merged.setdefault(key, value)
    return merged


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a killed parent nobody has reaped yet is a zombie: gone all the same
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def watch_parent(cleanup: Path | None = None) -> None:
    """In a child: exit as soon as the profkit process in ``$PROFKIT_PARENT_PID`` is gone.

    Called first thing by profkit's child processes, before torch starts threads. The
    direct parent's death also arrives as ``PR_SET_PDEATHSIG`` (SIGTERM, taken by the
    watcher); polling the pid covers a child whose direct parent is a wrapper (nsys). ``cleanup`` (the child's private temporary
    directory) is removed before exiting, since the dead parent cannot remove it.
    """
    pid_text = os.environ.get(PARENT_PID_ENV, "")
    if not pid_text.isdigit():
        return
    parent = int(pid_text)
    # Direct child: the kernel's death signal becomes SIGTERM, blocked here and taken by the
    # watcher thread (threads started later inherit the mask), so the child can remove its
    # temporary directory first. Until this runs, the SIGKILL set before exec stands.
    direct = parent == os.getppid() and hasattr(signal, "sigtimedwait")
    if direct:
        # The death signal first: once SIGTERM shows as blocked (what a watcher of this
        # process can see, as tests/test_kill.py does), the SIGKILL set before exec is gone.
        set_parent_death_signal(signal.SIGTERM)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def watch() -> None:
        while _alive(parent):
            if not direct:
                time.sleep(WATCH_INTERVAL_S)
            elif signal.sigtimedwait({signal.SIGTERM}, WATCH_INTERVAL_S) is not None:
                break  # the parent died (or someone ended us): clean up all the same
        if cleanup is not None and _TEMP_NAME.match(cleanup.name):
            shutil.rmtree(cleanup, ignore_errors=True)
        os._exit(137)  # as if killed: the parent is not there to read a result anyway

    threading.Thread(target=watch, name="profkit-parent-watch", daemon=True).start()


def remove_stale_tempdirs(root: Path | None = None) -> list[Path]:
    """Remove ``profkit-*-PID-*`` temporary directories whose owner PID is gone."""
    root = Path(root or tempfile.gettempdir())
    removed = []
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            match = _TEMP_NAME.match(entry.name)
            if match and entry.is_dir() and not _alive(int(match.group(1))):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed


@contextlib.contextmanager
def private_tempdir(kind: str) -> Iterator[Path]:
    """A temporary directory ``profkit-KIND-PID-…`` for one child, removed on the way out.

    Stale ones that killed runs left are removed first (see :func:`remove_stale_tempdirs`).
    """
    remove_stale_tempdirs()
    with tempfile.TemporaryDirectory(prefix=f"profkit-{kind}-{os.getpid()}-") as tmp:
        yield Path(tmp)


def install_terminate_as_interrupt() -> None:
    """For the whole process: SIGTERM and SIGHUP raise KeyboardInterrupt, as Ctrl-C does.

    So ``kill PID``, ``timeout``, a batch scheduler or a closed terminal end a sweep the
    way Ctrl-C does: the running child's tree is killed, finished rows stay committed and
    temporary directories are removed. Called once by the ``profkit`` entry point.
    """
    if threading.current_thread() is not threading.main_thread():
        return

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first), read from ``/proc``; [] elsewhere."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                # "pid (comm) state ppid ...": comm may hold spaces and parentheses
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    frontier = [pid]
    while frontier:
        kids = children.get(frontier.pop(), [])
        found.extend(kids)
        frontier.extend(kids)
    return found


def kill_tree(proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc``'s process group and every descendant, wherever they regrouped."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGSTOP)  # freeze the group so nothing forks meanwhile
    tree = descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class Outcome:
    """How a command run by :func:`run_logged` ended."""

    returncode: int | None
    """Exit status (negative: killed by that signal); None when it timed out."""
    wall_s: float
    log_path: Path
    timed_out: bool = False

    def tail(self, chars: int = TAIL_CHARS) -> str:
        """The last ``chars`` characters of the log (its whole output)."""
        return read_tail(self.log_path, chars)

    def last_line(self) -> str:
        """The last non-empty line of the output, or ``""``."""
        lines = [line for line in self.tail().splitlines() if line.strip()]
        return lines[-1].strip() if lines else ""

    def error_line(self) -> str:
        """The last line of the output that reads like an error, else the last line.

        Tools end with a usage hint after the error itself (nsys: "unrecognised option
        '--x'" then "Try 'nsys profile --help' for more information."); the error is the
        line worth showing.
        """
        lines = [line.strip() for line in self.tail().splitlines() if line.strip()]
        for line in reversed(lines):
            if _ERROR_WORDS.search(line):
                return line
        return lines[-1] if lines else ""


def read_tail(path: Path, chars: int = TAIL_CHARS) -> str:
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - chars))
            return log.read().decode(errors="replace")
    except OSError:
        return ""


def check_timeout(timeout_s: float | None) -> None:
    """Raise :class:`BadInput` unless ``timeout_s`` is None or a finite number of seconds > 0.

    ``nan`` and ``inf`` parse as floats but no clock can wait for them.
    """
    if timeout_s is not None and not (math.isfinite(timeout_s) and timeout_s > 0):
        raise BadInput(f"--timeout must be a positive number of seconds, got {timeout_s:g}")


def run_logged(
    argv: Sequence[str],
    log_path: Path,
    env: dict[str, str] | None = None,
    timeout_s: float | None = None,
    echo: IO[str] | None = None,
    stop_grace_s: float = 0.0,
    on_stopping: Callable[[], None] | None = None,
) -> Outcome:
    """Run ``argv`` (no shell) with stdout and stderr saved to ``log_path``.

    With ``echo`` the output is also copied there line by line as it comes (a user's
    program's own log). The command runs in its own session, so Ctrl-C reaches only us.
    On Ctrl-C (or SIGTERM) the command first gets SIGINT and up to ``stop_grace_s`` to
    wind down (nsys then stops the program and writes the report of what it captured;
    ``on_stopping`` is called as this starts), then the whole process tree is killed and
    KeyboardInterrupt re-raised; a second Ctrl-C cuts the wait short. On timeout the tree
    is killed at once. The log is kept. Raises :class:`MissingTool` when ``argv[0]``
    cannot be executed at all.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log_path, "w") as log:
        proc = _spawn(argv, log, env, echo)
        pump = _start_pump(proc, log, echo) if echo else None
        try:
            timed_out = _wait(proc, timeout_s, stop_grace_s, on_stopping)
        finally:
            if pump is not None:
                # a grandchild that outlived the tree could hold the pipe open; don't hang
                pump.join(timeout=5)
    return Outcome(
        returncode=None if timed_out else proc.returncode,
        wall_s=time.perf_counter() - started,
        log_path=log_path,
        timed_out=timed_out,
    )


def _spawn(
    argv: Sequence[str], log: IO[str], env: dict[str, str] | None, echo: IO[str] | None
) -> subprocess.Popen[str]:
    """Start ``argv`` in a session of its own, its output into ``log`` (or a pipe to echo)."""
    try:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if echo else log,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env=child_env(env),
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
    except OSError as exc:  # not a program this system can run (format, permission)
        raise MissingTool(f"cannot run {argv[0]}: {exc.strerror or exc}") from None


def _wait(
    proc: subprocess.Popen[str],
    timeout_s: float | None,
    stop_grace_s: float,
    on_stopping: Callable[[], None] | None,
) -> bool:
    """Wait for ``proc``; True if it ran out of time (then its tree is killed)."""
    try:
        with _terminate_as_interrupt():
            proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        proc.wait()
        return True
    except KeyboardInterrupt:
        _stop(proc, stop_grace_s, on_stopping)
        raise
    except BaseException:  # leave no orphaned GPU process behind
        kill_tree(proc)
        proc.wait()
        raise
    return False


def _stop(
    proc: subprocess.Popen[str], grace_s: float, on_stopping: Callable[[], None] | None
) -> None:
    """Ask the command to stop (SIGINT), wait up to ``grace_s``, then end its whole tree."""
    try:
        if grace_s > 0 and proc.poll() is None:
            if on_stopping is not None:
                on_stopping()
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGINT)
            with _terminate_as_interrupt():
                proc.wait(timeout=grace_s)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        pass  # out of patience, or a second Ctrl-C: no more waiting
    finally:
        kill_tree(proc)  # whatever the command left behind (a regrouped program) goes too
        proc.wait()


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM/SIGHUP (``timeout``, a batch scheduler, a closed terminal) act as Ctrl-C.

    Our child runs in its own session and would outlive us; raising KeyboardInterrupt
    lets the caller end the tree first.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _start_pump(proc: subprocess.Popen[str], log: IO[str], echo: IO[str]) -> threading.Thread:
    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with contextlib.suppress(OSError, ValueError):  # a closed echo stream or log
                log.write(line)
                echo.write(line)
                echo.flush()

    thread = threading.Thread(target=pump, name="profkit-output", daemon=True)
    thread.start()
    return thread


def describe_exit(code: int | None) -> str:
    """``exit status 3`` / ``killed by SIGKILL`` / ``timed out``."""
    if code is None:
        return "timed out"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"
