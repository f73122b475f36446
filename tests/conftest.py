"""Shared fixtures: the bundled model is loaded once per test process (a second or two once
models.py has converted its GGUF on this machine; about 20 s the first time).

`make test` runs the suite in one process per core (pytest-xdist, whole files per process): each process then
runs torch on one thread, so two processes use two cores without their thread pools spinning against each other.
"""
import os

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

from specdec_core import load

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="session")
def bundled():
    return load("bundled", device="cpu")


@pytest.fixture(scope="module", params=["default", "fp32"])
def either(request, bundled, bundled_fp32):
    """The bundled model in this machine's default dtype, then in float32 (skipped where float32 is the default:
    the first case already ran it)."""
    if request.param == "fp32" and bundled_fp32 is bundled:
        pytest.skip("float32 is this machine's default dtype: the default case ran it")
    return bundled if request.param == "default" else bundled_fp32


@pytest.fixture(scope="session", params=DEVICES)
def bundled_any(request, bundled):
    """The bundled model on each available device (CPU always; CUDA where a GPU exists)."""
    return bundled if request.param == "cpu" else load("bundled", device="cuda")


@pytest.fixture(scope="session")
def bundled_fp32(bundled):
    """The bundled model de-quantized to float32: chunking-independent argmax for exactness tests (the same
    model as `bundled` where float32 is this machine's default)."""
    return bundled if bundled.dtype == torch.float32 else load("bundled", dtype="fp32", device="cpu")


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA GPU on this machine"))])
def device(request):
    """Each device tests run on: the CPU always, CUDA where a GPU exists (skipped otherwise)."""
    return request.param


@pytest.fixture
def one_thread():
    """Tiny models run faster on one thread: a 2-thread pool spins against other processes on a small CPU."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
