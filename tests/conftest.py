"""Shared fixtures and markers: ``gpu`` tests skip without CUDA, ``nsys`` ones without nsys."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

DATA = Path(__file__).parent / "data"
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def pytest_configure(config: pytest.Config) -> None:
    # Child processes (sweeps, nsys, report --run) use one intra-op thread: on a busy
    # 2-core CI box, OpenMP threads that outnumber the free cores make each step 10x
    # slower. torch in this process is already imported, so only children see it.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Commands default to profiles/results.db in the working directory; keep test runs
    # (and the child processes they start) from writing into the checkout.
    if "PROFKIT_DB" not in os.environ:
        db_dir = Path(tempfile.mkdtemp(prefix="profkit-test-db-"))
        os.environ["PROFKIT_DB"] = str(db_dir / "results.db")
    # The columnar cache of traces (profkit.traces.cache) goes to a folder of this run's.
    if "PROFKIT_CACHE_DIR" not in os.environ:
        os.environ["PROFKIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="profkit-test-cache-")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_cuda = pytest.mark.skip(reason="needs a CUDA device")
    no_nsys = pytest.mark.skip(reason="needs Nsight Systems (nsys on PATH or PROFKIT_NSYS)")
    has_nsys = bool(os.environ.get("PROFKIT_NSYS") or shutil.which("nsys"))
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_cuda)
        if "nsys" in item.keywords and not has_nsys:
            item.add_marker(no_nsys)


@pytest.fixture
def data_dir() -> Path:
    return DATA
