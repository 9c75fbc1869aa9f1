"""Which backend a process runs its block pool on: select_backend.

Apart from backend.py because it names both implementations, and
cupy_backend.py builds on backend.py's checks and errors.
"""
from __future__ import annotations

from speckv.kernels.backend import CHOICES, Backend, NumpyBackend, cuda_available


def select_backend(choice: str = "auto", device: int = 0) -> Backend:
    """The backend named by choice ("auto" | "numpy" | "cupy").

    auto: CuPy on `device` when a CUDA device is usable, else NumPy. numpy:
    host memory, pinned when CuPy and a device are present. cupy:
    BackendUnavailable when it cannot run here. ValueError for other names.
    """
    if choice not in CHOICES:
        raise ValueError(f"backend={choice!r}: expected one of {', '.join(CHOICES)}")
    if choice == "numpy":
        return NumpyBackend(pinned=cuda_available())
    if choice == "auto" and not cuda_available():
        return NumpyBackend()
    from speckv.kernels.cupy_backend import CupyBackend  # CuPy is imported only when chosen

    return CupyBackend(device)
