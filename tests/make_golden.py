"""Record the golden outputs of ``tests/golden_cases.py`` into ``tests/data/golden/``.

    python tests/make_golden.py                 # every case, into tests/data/golden/
    python tests/make_golden.py --out DIR       # elsewhere (to compare two runs)
    python tests/make_golden.py -k ddp2         # only the cases whose name contains ddp2

The goldens are the contract of the reports as they were before the trace-reading engine
was restructured: ``tests/test_golden.py`` fails wherever today's code prints other JSON.
Regenerate them only when a documented bug fix changes an output on purpose; say in the
commit which cases changed and why (a regeneration that only hides a difference defeats
them). Run it against the code you mean to record: with another checkout's code, e.g.
a pristine worktree of a commit,

    git worktree add /tmp/base COMMIT
    PYTHONPATH=/tmp/base PROFKIT_CACHE_DIR=$(mktemp -d) python /tmp/base/tests/make_golden.py

(the worktree's own copy of this script, so that its tests/ and benchmarks/ are used).
``tests/data/golden/README.md`` names the commit the files came from. The columnar cache
goes to a fresh temporary folder unless ``PROFKIT_CACHE_DIR`` is set; ``PROFKIT_CACHE=0``
records without it (the outputs must be the same).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # golden_cases, nsys_data, ...
os.environ.setdefault("PROFKIT_CACHE_DIR", tempfile.mkdtemp(prefix="profkit-golden-cache-"))
os.environ.setdefault("PROFKIT_DB", str(Path(tempfile.mkdtemp()) / "results.db"))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from golden_cases import CASES, GOLDEN, Inputs, dumps, golden_path, run


def _commit(package: Path) -> str:
    """The commit of the code recorded (the checkout ``profkit`` is imported from)."""
    git = ["git", "-C", str(package.parent)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "profkit"],
                           capture_output=True, text=True)  # fmt: skip
    return head.stdout.strip() + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=GOLDEN, help="folder to write into")
    parser.add_argument("-k", dest="only", default="", help="only cases whose name has this")
    args = parser.parse_args()

    import profkit

    package = Path(profkit.__file__).resolve().parent
    commit = _commit(package)
    print(f"profkit from {package}, commit {commit}", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    cases = [c for c in CASES if args.only in c.name]
    with tempfile.TemporaryDirectory(prefix="profkit-golden-") as folder:
        inputs = Inputs(Path(folder))
        for case in cases:
            started = time.perf_counter()
            got = run(case, inputs)
            if got["exit_code"] != case.exit_code:
                sys.exit(f"{case.command}: exit {got['exit_code']}, expected {case.exit_code}\n"
                         f"{got['stderr']}")  # fmt: skip
            target = args.out / golden_path(case).name
            target.write_text(dumps(got) + "\n")
            print(f"{time.perf_counter() - started:6.2f} s  {target.name}", file=sys.stderr)
    if not args.only:
        names = "\n".join(f"- `{golden_path(c).name}`: `{c.command}`" for c in CASES)
        (args.out / "README.md").write_text(
            "# Golden JSON of `profkit kernels` and `profkit diff`\n\n"
            f"Recorded by `tests/make_golden.py` from the code of commit {commit}, "
            "the cases of `tests/golden_cases.py`; checked by `tests/test_golden.py`. "
            "Regenerate only for a documented bug fix that changes an output, and say so "
            "in the commit.\n\n"
            f"{len(CASES)} cases:\n\n{names}\n"
        )


if __name__ == "__main__":
    main()
