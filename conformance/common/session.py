"""What a conformance session knows of itself and its machine, for the chapters and the suite's conftest
alike: the stash keys of the backend under test and of its spec, and the CUDA devices this process sees."""

from __future__ import annotations

import functools

import pytest
import torch

from conformance.protocol import Backend

#: The backend under test (``--backend``), loaded once per session by the conftest.
BACKEND_KEY = pytest.StashKey[Backend]()
#: Its ``module:attr`` spec, as the command line gave it (a fresh process loads it again from this).
SPEC_KEY = pytest.StashKey[str]()


@functools.cache
def cuda_device_count() -> int:
    """CUDA devices this process sees (0 with a CPU build of torch or no driver)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
