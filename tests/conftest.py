"""Shared fixtures: the bundled model is loaded once per test session (about 15 s cold)."""
import pytest
import torch

from specdec_core import load

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="session")
def bundled():
    return load("bundled", device="cpu")


@pytest.fixture(scope="session", params=DEVICES)
def bundled_any(request, bundled):
    """The bundled model on each available device (CPU always; CUDA where a GPU exists)."""
    return bundled if request.param == "cpu" else load("bundled", device="cuda")


@pytest.fixture(scope="session")
def bundled_fp32():
    """The bundled model de-quantized to float32: chunking-independent argmax for exactness tests."""
    return load("bundled", dtype="fp32", device="cpu")


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
