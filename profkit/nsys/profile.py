"""``profkit nsys``: run the built-in workload or a user's program under Nsight Systems.

One run: ``nsys profile`` (argv from :mod:`profkit.nsys.argv`) writes
``profiles/NAME.nsys-rep`` and its full output to ``profiles/NAME.nsys.log``; the export
goes to ``profiles/NAME.sqlite``; the sidecar ``profiles/NAME.profkit.json`` records the
config, the child's per-step Python phase times and where the time went
(:mod:`profkit.nsys.record`); the kernel report goes to ``reports/NAME.md``.
Failures keep every file already written and say which.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from profkit.errors import BadInput, MissingTool, ProfkitError
from profkit.files import output_dirs
from profkit.nsys.argv import (
    NsysOptions,
    RunFiles,
    check_name,
    check_program,
    default_name,
    placeholder_result_path,
    profile_argv,
)
from profkit.nsys.record import new_record, run_section
from profkit.run.child import child_argv, collect_result
from profkit.run.proc import Outcome, check_timeout, describe_exit, private_tempdir, run_logged
from profkit.run.tools import export_sqlite, find_nsys, nsys_version
from profkit.run.torchrun import check_nproc
from profkit.sidecar import write_sidecar
from profkit.workload import cuda
from profkit.workload.config import WorkloadConfig

Target = WorkloadConfig | Sequence[str]
# After Ctrl-C nsys stops the program and writes the report of what it captured; a big
# capture takes a while to write, a second Ctrl-C stops at once.
STOP_GRACE_S = 120.0
# Unbuffered output streams a user's program log through as it runs.
CHILD_ENV = {"PYTHONUNBUFFERED": "1"}


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run; ``kept`` lists the files it had written."""

    def __init__(self, kept: list[Path]) -> None:
        super().__init__("interrupted")
        self.kept = kept


@dataclass
class NsysRun:
    """What :func:`profile` wrote: the files, the sidecar record and the report text."""

    files: RunFiles
    record: dict[str, Any]
    report_markdown: str


@dataclass
class Plan:
    """The exact command a run executes, and the files it writes."""

    argv: list[str]
    nsys_argv: list[str]
    files: RunFiles
    builtin: bool
    nsys_found: bool = True
    """False when a dry run found no nsys and shows the bare name ``nsys`` instead."""

    def to_json(self) -> dict[str, Any]:
        """What ``--dry-run --format json`` prints: the argv and the files a run writes."""
        files = self.files
        return {
            "argv": self.argv,
            "nsys_found": self.nsys_found,
            "files": {
                "report": str(files.report),
                "sqlite": str(files.sqlite),
                "sidecar": str(files.sidecar),
                "log": str(files.log),
                "markdown": str(files.markdown),
            },
        }


def plan(
    target: Target,
    name: str | None = None,
    out_dir: Path | None = None,
    reports_dir: Path | None = None,
    options: NsysOptions | None = None,
    nsys: str | Path | None = None,
    result_path: Path | None = None,
    require_nsys: bool = True,
) -> Plan:
    """Resolve nsys and build the whole argv (what ``--dry-run`` prints).

    With ``require_nsys=False`` (a dry run) an nsys missing from PATH shows as ``nsys``
    (``Plan.nsys_found`` is False); one named by ``nsys`` or $PROFKIT_NSYS must still exist.
    """
    options = options or NsysOptions()
    builtin = isinstance(target, WorkloadConfig)
    program = None if isinstance(target, WorkloadConfig) else check_program(target)
    files = RunFiles(check_name(name or default_name(target)), *output_dirs(out_dir, reports_dir))
    found = True
    try:
        exe = find_nsys(nsys)
    except MissingTool:
        if require_nsys or nsys or os.environ.get("PROFKIT_NSYS"):
            raise
        exe, found = Path("nsys"), False
    nsys_argv = profile_argv(exe, files.report, options, builtin)
    if isinstance(target, WorkloadConfig):
        result = result_path or placeholder_result_path()
        argv = [*nsys_argv, *child_argv(target, result, "cuda-profiler-api")]
    else:
        assert program is not None
        argv = [*nsys_argv, *program]
    return Plan(argv, nsys_argv, files, builtin, found)


def profile(
    target: Target,
    name: str | None = None,
    out_dir: Path | None = None,
    reports_dir: Path | None = None,
    options: NsysOptions | None = None,
    nsys: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
    echo: IO[str] | None = None,
    timeout_s: float | None = None,
) -> NsysRun:
    """Profile ``target`` (a WorkloadConfig, or a program's argv) under nsys, end to end.

    Captures, exports to SQLite, writes the sidecar, analyses the kernels and writes the
    report. Raises :class:`ProfkitError` (files written so far are kept) when nsys, the
    program or the analysis fails. ``echo`` receives the program's output as it runs.
    """
    started = time.perf_counter()
    say = progress or (lambda _message: None)
    check_name(name or default_name(target))  # bad input first, then CUDA, then nsys
    check_timeout(timeout_s)
    if isinstance(target, WorkloadConfig):
        require_cuda(target)
        check_nproc(target, "cuda")
    else:
        check_program(target)
    with private_tempdir("nsys") as tmp:
        result_path = tmp / "result.json"
        run = plan(target, name, out_dir, reports_dir, options, nsys, result_path)
        files = run.files
        _clear_earlier_run(files, say)
        record = new_record(
            files.name,
            target.to_dict() if isinstance(target, WorkloadConfig) else None,
            None if isinstance(target, WorkloadConfig) else list(target),
            run.nsys_argv,
            nsys_version(Path(run.nsys_argv[0])),
            {kind: str(path) for kind, path in _file_kinds(files).items()},
        )
        say(f"profiling {files.name} under nsys")
        outcome = _capture(run, record, say, echo, timeout_s)
        wrote_result = _record_result(target, record, outcome, result_path)
    write_sidecar(files.sidecar, record)
    _check_capture(record["result"], outcome, files, wrote_result, run.builtin)

    say(f"exporting {files.report} to SQLite")
    with _timed(record, "export"):
        export_sqlite(files.report, run.nsys_argv[0], force=True)
    write_sidecar(files.sidecar, record)  # readers of the export see the run's config

    say("analysing kernels")
    with _timed(record, "analysis"):
        try:
            kernels_markdown = _post_process(files.sqlite, files.name)
        except ProfkitError as exc:
            raise ProfkitError(f"{exc} (kept {files.report}, {files.sqlite})") from None
    record["timings_s"]["total"] = time.perf_counter() - started
    markdown = kernels_markdown.rstrip() + "\n\n" + run_section(record)
    _write(files.markdown, markdown)
    write_sidecar(files.sidecar, record)
    return NsysRun(files, record, markdown)


def _capture(
    run: Plan,
    record: dict[str, Any],
    say: Callable[[str], None],
    echo: IO[str] | None,
    timeout_s: float | None,
) -> Outcome:
    """Run nsys; on Ctrl-C record the interruption and raise :class:`Interrupted`."""
    files = run.files
    try:
        outcome = run_logged(
            run.argv, files.log, env=CHILD_ENV, timeout_s=timeout_s, echo=echo,
            stop_grace_s=STOP_GRACE_S,
            on_stopping=lambda: say(
                "stopping: nsys is writing the report of what it captured "
                "(Ctrl-C again to stop at once)"
            ),
        )  # fmt: skip
    except KeyboardInterrupt:
        record["result"] = {"status": "interrupted", "error": "stopped by Ctrl-C"}
        write_sidecar(files.sidecar, record)
        kept = [p for p in (files.report, files.sidecar, files.log) if p.exists()]
        raise Interrupted(kept) from None
    record["timings_s"]["nsys_profile"] = outcome.wall_s
    record["nsys"]["returncode"] = outcome.returncode
    return outcome


def _record_result(
    target: Target, record: dict[str, Any], outcome: Outcome, result_path: Path
) -> bool:
    """Put the run's result into ``record``; True when the built-in child wrote its own."""
    if not isinstance(target, WorkloadConfig):
        record["result"] = _program_result(outcome)
        return False  # a program's exit status can't be told apart from nsys's
    wrote_result = result_path.exists()
    # A result the child wrote is its own verdict; nsys's exit status is judged apart.
    rc = 0 if wrote_result or outcome.returncode is None else outcome.returncode
    record["result"] = collect_result(target, result_path, rc, outcome.tail())
    return wrote_result


@contextlib.contextmanager
def _timed(record: dict[str, Any], part: str) -> Iterator[None]:
    started = time.perf_counter()
    yield
    record["timings_s"][part] = time.perf_counter() - started


def _post_process(sqlite_path: Path, name: str) -> str:
    """The kernel report of an export, as markdown: the same analysis as ``profkit kernels``."""
    from profkit.analysis import kernel_report, kernel_report_markdown
    from profkit.traces.host_calls import host_traces
    from profkit.traces.job import load

    job = load([sqlite_path])
    report = kernel_report(job, top=20, hosts=host_traces(job.paths, job.files))
    return str(kernel_report_markdown(report, f"Kernels: {name}"))  # with its ranks, if any


def require_cuda(config: WorkloadConfig) -> None:
    """The built-in model under nsys needs CUDA: without it there are no kernels to trace."""
    hint = "your own program still runs under nsys: `profkit nsys -- python train.py`"
    if config.device in ("cpu", "mps"):
        raise BadInput(
            f"nsys profiling of the built-in model needs a CUDA device, not --device "
            f"{config.device} ({hint})"
        )
    if cuda.device_count() == 0:
        raise MissingTool(
            f"nsys profiling of the built-in model needs a CUDA device, and none is visible "
            f"here ({hint})"
        )


def _program_result(outcome: Outcome) -> dict[str, Any]:
    ok = outcome.returncode == 0
    return {
        "status": "ok" if ok else "error",
        "returncode": outcome.returncode,
        "error": None if ok else f"program ended with {describe_exit(outcome.returncode)}",
        "wall_s": outcome.wall_s,
    }


def _check_capture(
    result: dict[str, Any], outcome: Outcome, files: RunFiles, wrote_result: bool, builtin: bool
) -> None:
    """Raise a one-line error naming the kept files unless the capture is usable."""
    log = f"full output in {files.log}"
    have_report = files.report.is_file()
    if result["status"] == "ok" and have_report:
        return
    if outcome.timed_out:
        raise ProfkitError(f"nsys run timed out; {_kept(files)}; {log}")
    what = "the built-in workload" if builtin else "the program"
    if result["status"] == "ok":  # the program was fine; nsys produced nothing
        raise ProfkitError(f"nsys wrote no report: {outcome.error_line() or 'no output'}; {log}")
    if wrote_result and not have_report:
        # the workload ran and failed; nsys produced nothing (e.g. before the capture range)
        raise ProfkitError(f"{what} failed under nsys ({result['error']}); no report; {log}")
    if not have_report:
        failed = "nsys failed" if builtin else "nsys or the program failed"
        raise ProfkitError(
            f"{failed} ({describe_exit(outcome.returncode)}): "
            f"{outcome.error_line() or 'no output'}; {log}"
        )
    raise ProfkitError(
        f"{what} failed under nsys ({result['status']}: {result['error']}); {_kept(files)}; "
        f"{log}; `profkit kernels {files.report}` reads what was captured"
    )


def _kept(files: RunFiles) -> str:
    kept = [str(p) for p in (files.report, files.sidecar) if p.exists()]
    return "kept " + ", ".join(kept) if kept else "no files kept"


def _clear_earlier_run(files: RunFiles, say: Callable[[str], None]) -> None:
    """Remove an earlier run's files of the same name, so none is mistaken for this run's."""
    earlier = [path for path in files.all() if path.exists()]
    if earlier:
        say(f"replacing the earlier run's files named {files.name}")
    for path in earlier:
        try:
            path.unlink()
        except OSError as exc:
            raise BadInput(f"cannot replace {path}: {exc.strerror or exc}") from None
    for directory in (files.out_dir, files.reports_dir):
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BadInput(f"cannot create {directory}: {exc.strerror or exc}") from None


def _file_kinds(files: RunFiles) -> dict[str, Path]:
    return {
        "nsys_rep": files.report,
        "sqlite": files.sqlite,
        "sidecar": files.sidecar,
        "log": files.log,
        "report_md": files.markdown,
    }


def _write(path: Path, text: str) -> None:
    from profkit.formats import write_text

    write_text(path, text if text.endswith("\n") else text + "\n")
