"""How many CUDA devices this process may use, asked of the driver rather than of torch.

A parent that only launches the children that train (``profkit nsys``, ``bench``,
``memory``) needs to know whether CUDA devices are there, and how many (``--nproc`` may not
ask for more), before it starts them. Importing torch to ask costs it seconds
(``benchmarks/nsys_nproc_overhead.sh`` measures both); the driver API answers in
milliseconds and honours ``CUDA_VISIBLE_DEVICES`` as torch does. A CPU build of torch
(``2.13.0+cpu``) sees no device whatever the driver says. Where the driver library cannot
be loaded (no NVIDIA driver, or a ROCm machine whose torch.cuda runs on HIP), torch is
asked after all.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from importlib import metadata

_DRIVER_LIBRARIES = {"linux": "libcuda.so.1", "win32": "nvcuda.dll"}


@functools.cache
def device_count() -> int:
    """CUDA devices torch will see in this process (0 without a driver or a device)."""
    driver = _driver()
    if driver is None:
        import torch

        return int(torch.cuda.device_count())
    if driver.cuInit(0) != 0:  # e.g. CUDA_ERROR_NO_DEVICE, or CUDA_VISIBLE_DEVICES=""
        return 0
    count = ctypes.c_int(0)
    if driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return 0 if _cpu_build_of_torch() else count.value


def _driver() -> ctypes.CDLL | None:
    name = _DRIVER_LIBRARIES.get(sys.platform)
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def _cpu_build_of_torch() -> bool:
    try:
        return metadata.version("torch").endswith("+cpu")
    except metadata.PackageNotFoundError:
        return False
