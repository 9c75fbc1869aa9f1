"""select_backend: the backend a process's block pool runs on."""
from __future__ import annotations

import pytest

from speckv.kernels.backend import BackendUnavailable, NumpyBackend, cuda_available
from speckv.kernels.backend_choice import select_backend


def test_select_backend_follows_the_hardware():
    device = cuda_available()
    assert select_backend("auto").name == ("cupy" if device else "numpy")
    numpy_backend = select_backend("numpy")
    assert numpy_backend.name == "numpy" and numpy_backend.pinned == device
    if device:
        assert select_backend("cupy").name == "cupy"
    else:
        with pytest.raises(BackendUnavailable, match="backend=cupy"):
            select_backend("cupy")
        with pytest.raises(BackendUnavailable, match="pinned"):
            NumpyBackend(pinned=True)
    with pytest.raises(ValueError, match="backend='gpu'"):
        select_backend("gpu")
