"""A GPU's energy counter through NVML, for ``policy: smdp``'s power weight.

NVML's total energy (millijoules since the driver loaded; Volta and newer GPUs) is read through
``ctypes`` from ``libnvidia-ml.so.1``, which every NVIDIA driver installs, so no Python package
is needed. The GPU is found by the UUID CUDA gives it (NVML's indices ignore
``CUDA_VISIBLE_DEVICES``). Where there is no driver library, no such GPU or no counter,
``energy_counter`` says why and the policy keeps its proxy (the engines' busy seconds).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

SUCCESS = 0


class NvmlError(RuntimeError):
    """NVML cannot give this GPU's energy; the message says why."""


def energy_counter(uuid: str) -> Callable[[], float]:
    """A function giving the energy the GPU of CUDA UUID ``uuid`` has used so far, in joules."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as exc:
        raise NvmlError(f"no NVML ({exc})") from None
    _check(lib, lib.nvmlInit_v2(), "nvmlInit")
    handle = ctypes.c_void_p()
    name = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
    _check(lib, lib.nvmlDeviceGetHandleByUUID(name.encode(), ctypes.byref(handle)), f"no GPU {name}")
    millijoules = ctypes.c_ulonglong()

    def read() -> float:
        _check(lib, lib.nvmlDeviceGetTotalEnergyConsumption(handle, ctypes.byref(millijoules)),
               "no energy counter")
        return millijoules.value / 1000

    read()  # a GPU without the counter says so now, not while serving
    return read


def _check(lib: ctypes.CDLL, status: int, what: str) -> None:
    if status != SUCCESS:
        lib.nvmlErrorString.restype = ctypes.c_char_p
        raise NvmlError(f"{what}: NVML {status} ({lib.nvmlErrorString(status).decode()})")
