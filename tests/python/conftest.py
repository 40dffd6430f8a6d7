"""pytest configuration of the Python test suite.

* ``gpu`` tests need a CUDA device and a CUDA build of openkda; they are skipped cleanly otherwise.
* Precision: the public API runs the CPU backend in fp32; tests that compare against the float64
  reference at tight tolerances switch it to fp64 with ``openkda.cpu_precision("f64")`` (the
  ``f64_core`` fixture). ``OPENKDA_CPU_PRECISION=f64`` in the environment changes the default.
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))


def _cuda_reason():
    if not torch.cuda.is_available():
        return "CUDA is not available"
    import openkda

    if not openkda.build_config().get("cuda"):
        return "openkda was built without the CUDA backend (OPENKDA_ENABLE_CUDA=OFF)"
    return None


def pytest_collection_modifyitems(config, items):
    if not any("gpu" in item.keywords for item in items):
        return
    reason = _cuda_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(42)
    yield


@pytest.fixture
def f64_core():
    """Runs the CPU backend in fp64 for the duration of the test."""
    import openkda

    with openkda.cpu_precision("f64"):
        yield
