"""After torch.profiler ran on CUDA, profkit ends its process without the interpreter's
teardown (``profkit.run.teardown``): checked here in real processes, since what is tested
is how a process ends. The CUDA run itself is checked on the GPU machine
(docs/TORCH_PROFILER.md)."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import atexit, sys
from profkit.run import teardown
atexit.register(lambda: print("teardown ran", file=sys.stderr))
print("the command's output", end="")  # still buffered: leave() must flush it
{mark}
teardown.leave({status})
print(" and then the rest")
"""


def _run(mark: str, status: int) -> subprocess.CompletedProcess[str]:
    code = PROGRAM.format(mark=mark, status=status)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip


def test_after_cuda_profiling_the_process_ends_with_the_status_and_no_teardown() -> None:
    done = _run("teardown.cuda_profiled()", 3)
    assert (done.returncode, done.stdout, done.stderr) == (3, "the command's output", "")


def test_otherwise_leave_returns_and_the_teardown_runs() -> None:
    done = _run("", 3)
    assert done.returncode == 0
    assert done.stdout == "the command's output and then the rest\n"
    assert done.stderr == "teardown ran\n"


def test_profkit_ends_as_before_where_nothing_was_profiled_on_cuda() -> None:
    done = subprocess.run([sys.executable, "-m", "profkit", "sizes", "--size", "nope"],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2 and done.stderr.startswith("error: ")
