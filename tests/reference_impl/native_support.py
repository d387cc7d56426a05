"""Shared by the native ``mm_out`` shim's self-tests (test_native_shim, test_native_entry,
test_native_routing): torch's headers, the C++ compiler and the skip marks."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

TORCH_INCLUDE = Path(torch.__file__).parent / "include"
CXX = shutil.which("g++")
needs_cxx = pytest.mark.skipif(CXX is None, reason="needs g++")
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
