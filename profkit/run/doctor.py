"""What this machine has, and which profkit commands can run here.

``doctor()`` looks for each component (torch, CUDA, the GPU, Nsight Systems, nvtx, the
Python packages, a C++ compiler for ``torch.compile`` on CPU) and derives, from what it
found, which commands run fully, partly or not at all — with what to install for the rest.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import sys
from dataclasses import asdict, dataclass
from typing import Any

import profkit
from profkit.errors import DASK_INSTALL
from profkit.run.environment import git_state


@dataclass
class Component:
    name: str
    found: bool
    detail: str


@dataclass
class Capability:
    command: str
    status: str
    """``ready``, ``partial`` (runs, with limits) or ``missing`` (cannot run here)."""
    needs: str
    note: str


def _package_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _module(name: str, dist: str) -> Component:
    try:
        importlib.import_module(name)
    except Exception as exc:  # a broken install is "not found" with the reason
        return Component(dist, False, f"cannot import {name}: {exc}")
    return Component(dist, True, _package_version(dist) or "installed")


def _dask_component() -> Component:
    """Dask's distributed scheduler, the optional extra of ``kernels --workers/--scheduler``
    (its version from the package's metadata: importing it takes most of a second)."""
    if importlib.util.find_spec("distributed") is None:
        return Component("dask", False, f"not installed (--workers/--scheduler): {DASK_INSTALL}")
    return Component("dask", True, f"distributed {_package_version('distributed') or '?'}")


def _torch_components() -> tuple[list[Component], dict[str, bool]]:
    import torch

    has_cuda = torch.cuda.is_available()
    mps = getattr(torch.backends, "mps", None)
    has_mps = bool(mps and mps.is_available())
    components = [Component("torch", True, torch.__version__)]
    if has_cuda:
        count = torch.cuda.device_count()
        names = []
        for index in range(count):
            props = torch.cuda.get_device_properties(index)
            names.append(
                f"{props.name} ({props.total_memory / 1024**3:.0f} GiB, "
                f"sm_{props.major}{props.minor})"
            )
        components.append(Component("CUDA", True, f"{torch.version.cuda}, {count} device(s)"))
        components.append(Component("GPU", True, "; ".join(names)))
    else:
        built = f"torch built with CUDA {torch.version.cuda}" if torch.version.cuda else ""
        why = "no CUDA device visible" + (f" ({built})" if built else " (CPU-only torch)")
        components.append(Component("CUDA", False, why))
        components.append(Component("GPU", False, "none"))
    if has_mps:
        components.append(Component("MPS", True, "Apple GPU available"))
    return components, {"cuda": has_cuda, "mps": has_mps}


def _nsys_component() -> Component:
    from profkit.errors import MissingTool
    from profkit.run.tools import find_nsys, nsys_version

    try:
        path = find_nsys()
    except MissingTool as exc:
        if os.environ.get("PROFKIT_NSYS"):
            return Component("nsys", False, str(exc))
        return Component("nsys", False, "not on PATH (install Nsight Systems or set PROFKIT_NSYS)")
    version = nsys_version(path)
    return Component("nsys", True, f"{version or 'unknown version'} at {path}")


def _compiler_component(has_cuda: bool) -> Component:
    if has_cuda:
        triton = _package_version("triton") or _package_version("pytorch-triton")
        if triton:
            return Component("torch.compile", True, f"triton {triton} (GPU kernels)")
        return Component("torch.compile", False, "triton not installed: --compile will fail")
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")
    if cxx:
        return Component("torch.compile", True, f"C++ compiler {cxx} (CPU kernels)")
    return Component("torch.compile", False, "no C++ compiler (g++/clang++): --compile fails")


def _capabilities(found: dict[str, bool]) -> list[Capability]:
    cuda, nsys, mpl = found["cuda"], found["nsys"], found["matplotlib"]
    device = "CUDA" if cuda else ("MPS" if found["mps"] else "CPU")
    where = f"runs on {device}" + ("" if cuda else " (no MFU without a GPU)")
    ready, partial, missing = "ready", "partial", "missing"
    nsys_missing = " and ".join(n for n, ok in (("nsys", nsys), ("CUDA", cuda)) if not ok)
    return [
        Capability("sizes", ready, "-", ""),
        Capability("bench", ready, "torch", where),
        Capability(
            "nsys",
            ready if cuda and nsys else missing,
            "nsys and CUDA",
            f"missing: {nsys_missing}" if nsys_missing else "",
        ),
        Capability(
            "torch",
            ready if cuda else partial,
            "torch; CUDA for GPU kernels",
            "" if cuda else "CPU ops only (no GPU kernels)",
        ),
        Capability(
            "kernels",
            ready if nsys and found["dask"] else partial,
            "-; nsys to export .nsys-rep; Dask for --workers/--scheduler",
            "; ".join(
                note
                for note, applies in (
                    (".sqlite exports and Chrome traces only (.nsys-rep needs nsys)", not nsys),
                    ("in one process only (--workers/--scheduler need Dask)", not found["dask"]),
                )
                if applies
            ),
        ),
        Capability(
            "memory",
            ready if cuda and mpl else partial,
            "CUDA to capture; matplotlib to plot",
            "" if cuda else "summarize/plot of existing snapshots only (capture needs CUDA)",
        ),
        Capability("attention", ready, "torch", f"runs on {device}"),
        Capability(
            "precision",
            ready if cuda else partial,
            "CUDA for fp16/bf16 autocast",
            "" if cuda else "accumulate, and fp16/bf16 autocast on the CPU only",
        ),
        Capability("compare", ready, "a results DB", "reads rows that bench wrote"),
        Capability("diff", ready, "-", "nsys exports and Chrome traces, any mix"),
        Capability(
            "report",
            ready if mpl else partial,
            "matplotlib; CUDA (and nsys) for all of --run",
            "; ".join(
                note
                for note, applies in (
                    ("tables, no plots", not mpl),
                    ("--run measures a CPU subset (no nsys, no memory)", not cuda),
                )
                if applies
            ),
        ),
        Capability("demo", ready, "-", f"runs on {device}"),
    ]


def doctor() -> dict[str, Any]:
    """Components found here and the commands they enable (the ``profkit doctor`` data)."""
    commit, dirty = git_state()
    version = profkit.__version__ + (
        f" ({commit[:10]}{'+dirty' if dirty else ''})" if commit else ""
    )
    components = [
        Component("python", True, f"{platform.python_version()} ({sys.executable})"),
        Component("profkit", True, version),
    ]
    torch_components, found = _torch_components()
    components += torch_components
    nsys = _nsys_component()
    components.append(nsys)
    components.append(_compiler_component(found["cuda"]))
    packages = [
        _module(name, dist)
        for name, dist in (
            ("nvtx", "nvtx"),
            ("sqlite_utils", "sqlite-utils"),
            ("matplotlib", "matplotlib"),
            ("pandas", "pandas"),
        )
    ]
    components += packages
    dask = _dask_component()
    components.append(dask)
    found.update(nsys=nsys.found, matplotlib=packages[2].found, dask=dask.found)
    return {
        "components": [asdict(c) for c in components],
        "commands": [asdict(c) for c in _capabilities(found)],
    }
