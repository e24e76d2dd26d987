"""What an Nsight Systems export's times count from: checked against the wall clock.

Several nodes' reports are put on one clock by their session starts
(``TARGET_INFO_SESSION_START_TIME.utcEpochNs``, see docs/MULTI_GPU.md), which holds only if
an export's timestamps are nanoseconds since that UTC instant. This program reads the wall
clock (``time.time_ns``) just before it opens an NVTX range and launches a matmul inside a
``cudaProfilerStart`` capture, prints it, and ``--check`` compares it with the export:
``utcEpochNs + start`` of the range and of the kernel should land just after that reading
(a fraction of a millisecond), and far from it if the times counted from the capture's
start (``ANALYSIS_DETAILS.startTime``) instead. On the GPU machine (needs CUDA and nsys)::

    nsys profile -t cuda,nvtx --sample=none --cpuctxsw=none --capture-range=cudaProfilerApi \\
        --capture-range-end=stop -o clk python3 benchmarks/session_clock.py > wall.txt
    nsys export --type sqlite -o clk.sqlite clk.nsys-rep
    python3 benchmarks/session_clock.py --check clk.sqlite wall.txt
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
from pathlib import Path


def capture() -> None:
    import nvtx
    import torch

    x = torch.randn(1024, 1024, device="cuda")
    for _ in range(3):  # warm-up outside the capture
        (x @ x).sum().item()
    torch.cuda.cudart().cudaProfilerStart()
    time.sleep(0.5)
    wall = time.time_ns()
    mark = nvtx.start_range("mark")
    x @ x
    torch.cuda.synchronize()
    nvtx.end_range(mark)
    torch.cuda.cudart().cudaProfilerStop()
    print("WALL_NS", wall)


def check(export: Path, wall_file: Path) -> None:
    wall = int(wall_file.read_text().split("WALL_NS", 1)[1].split()[0])
    conn = sqlite3.connect(export)
    utc = conn.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]
    window = conn.execute("SELECT startTime FROM ANALYSIS_DETAILS").fetchone()[0]
    nvtx_start = conn.execute("SELECT max(start) FROM NVTX_EVENTS").fetchone()[0]
    kernel = conn.execute("SELECT max(start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    for what, start in (("NVTX range", nvtx_start), ("kernel", kernel)):
        print(
            f"{what}: utcEpochNs + start is {(utc + start - wall) / 1e6:+.3f} ms from the wall "
            f"clock read before it; with ANALYSIS_DETAILS.startTime added, "
            f"{(utc + window + start - wall) / 1e6:+.3f} ms"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", nargs=2, type=Path, metavar=("EXPORT", "WALL_FILE"))
    args = parser.parse_args()
    if args.check:
        check(*args.check)
    else:
        capture()
    return 0


if __name__ == "__main__":
    sys.exit(main())
