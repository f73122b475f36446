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
