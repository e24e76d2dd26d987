"""How many CUDA devices this process may use, asked of the driver, not of torch.

The parent of ``profkit nsys`` launches the children that train; it needs to know only
whether CUDA devices are there, and how many (``--nproc`` may not ask for more), before it
starts them. Importing torch to ask costs the parent seconds (``benchmarks/
nsys_nproc_overhead.sh`` measures both); the driver API answers in milliseconds, and it
honours ``CUDA_VISIBLE_DEVICES`` as torch does. Where the driver library cannot be loaded
there is no CUDA device for torch either, except on a platform whose driver library this
module does not know, where it asks torch after all.
"""

from __future__ import annotations

import ctypes
import functools
import sys

_DRIVER_LIBRARIES = {"linux": "libcuda.so.1", "win32": "nvcuda.dll"}


@functools.cache
def device_count() -> int:
    """CUDA devices visible to this process (0 without a driver or a device)."""
    name = _DRIVER_LIBRARIES.get(sys.platform)
    if name is None:  # macOS and others: torch knows (and finds none)
        import torch

        return int(torch.cuda.device_count())
    try:
        driver = ctypes.CDLL(name)
    except OSError:  # no NVIDIA driver installed
        return 0
    if driver.cuInit(0) != 0:  # e.g. CUDA_ERROR_NO_DEVICE, or CUDA_VISIBLE_DEVICES=""
        return 0
    count = ctypes.c_int(0)
    if driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value
