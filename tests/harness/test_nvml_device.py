"""The PCIe traffic meter's device side on CPU: the NVML field decoding, the unsupported path (real pynvml;
NVML does not initialise on a machine without a driver) and the per-GPU file lock across processes. The
meter's maths, poller and simulated link are in test_nvml_traffic.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest

from harness.locks import LockTimeout, gpu_lock, lock_path
from harness.nvml_counters import (
    CounterUnsupported,
    pcie_counter_reader,
)
from harness.nvml_memory import device_memory
from harness.nvml_traffic import TrafficMeter

# ---------------------------------------------------------------------------------------------- NVML decoding


def field(value: int, ret: int = pynvml.NVML_SUCCESS, vtype: int = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG):
    f = pynvml.c_nvmlFieldValue_t()
    f.nvmlReturn = ret
    f.valueType = vtype
    if vtype == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        f.value.uiVal = value
    else:
        f.value.ullVal = value
    return f


def fake_nvml(**overrides: object) -> SimpleNamespace:
    """The real pynvml constants and structures, with the device calls replaced."""
    names = {
        n: getattr(pynvml, n) for n in dir(pynvml) if n.isupper() or n.startswith(("NVML", "nvmlMemory"))
    }
    return SimpleNamespace(**{**names, "__name__": "fake_pynvml", **overrides})


def test_reader_decodes_field_values_by_type() -> None:
    nvml = fake_nvml(
        nvmlDeviceGetFieldValues=lambda handle, ids: [
            field(123, vtype=pynvml.NVML_VALUE_TYPE_UNSIGNED_INT),
            field(2**32 - 1),
        ]
    )
    assert pcie_counter_reader(nvml, object())() == (123, 2**32 - 1)


def test_reader_raises_unsupported_on_a_per_field_error() -> None:
    nvml = fake_nvml(
        nvmlDeviceGetFieldValues=lambda handle, ids: [field(0, ret=pynvml.NVML_ERROR_NOT_SUPPORTED), field(0)]
    )
    with pytest.raises(CounterUnsupported, match=r"NVML_FI_DEV_PCIE_COUNT_TX_BYTES.*Not Supported"):
        pcie_counter_reader(nvml, object())()


def test_device_memory_falls_back_to_v1() -> None:
    def get_memory(handle: object, version: int | None = None) -> object:
        if version:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return SimpleNamespace(used=5, total=10, free=5)

    info = device_memory(fake_nvml(nvmlDeviceGetMemoryInfo=get_memory), object())
    assert info == {"nvml_memory_info": "v1", "used_bytes": 5, "total_bytes": 10}


# ---------------------------------------------------------------------------------------------- unsupported


def assert_unsupported(meter: TrafficMeter) -> None:
    ran = []
    m = meter.measure(lambda: ran.append(1))
    assert ran == [1], "the workload runs even where it cannot be metered"
    assert not m.valid
    assert m.h2d_bytes is None
    assert m.d2h_bytes is None
    assert m.h2d_payload_bytes is None
    assert (m.reason or "").startswith("unsupported: ")
    record = m.to_record("traffic_meter", "x", {}).to_dict()
    for name in ("h2d_bytes", "d2h_bytes", "h2d_payload_bytes", "d2h_payload_bytes"):
        metric = record["metrics"][name]
        assert metric["value"] is None, metric
        assert metric["note"].startswith("unsupported: "), metric


def test_nvml_unavailable_reads_as_unsupported_not_zero() -> None:
    # On a machine without a driver nvmlInit fails (the real path); on a GPU machine NVML runs but has
    # no device with this UUID. Both must end as "unsupported" with the reason, never as 0 bytes.
    with TrafficMeter("GPU-00000000-0000-0000-0000-000000000000") as meter:
        assert not meter.supported
        assert "NVML" in (meter.reason or "")
        assert_unsupported(meter)


def test_no_cuda_device_reads_as_unsupported() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device; the no-device path is exercised on CPU machines")
    with TrafficMeter(0) as meter:
        assert "no CUDA device" in (meter.reason or "")
        assert_unsupported(meter)


# ---------------------------------------------------------------------------------------------- the lock

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from harness.locks import gpu_lock
    with gpu_lock(sys.argv[1], directory=Path(sys.argv[2])):
        print("locked", flush=True)
        sys.stdin.readline()
    """
)


def test_lock_excludes_another_process(tmp_path: Path) -> None:
    uuid = "GPU-test-lock-0001"
    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, uuid, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
    )
    try:
        assert child.stdout is not None
        assert child.stdin is not None
        assert child.stdout.readline().strip() == "locked"
        with (
            pytest.raises(LockTimeout, match=f"pid {child.pid}"),
            gpu_lock(uuid, timeout_s=0.2, directory=tmp_path),
        ):
            pass
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(timeout=10) == 0
        started = time.monotonic()
        with gpu_lock(uuid, timeout_s=5, directory=tmp_path):
            assert time.monotonic() - started < 2
    finally:
        child.kill()
        child.wait()


def test_lock_is_reentrant_in_a_thread_and_exclusive_between_threads(tmp_path: Path) -> None:
    uuid = "GPU-test-lock-0002"
    outcome: list[str] = []

    def other_thread() -> None:
        try:
            with gpu_lock(uuid, timeout_s=0.1, directory=tmp_path):
                outcome.append("acquired")
        except LockTimeout:
            outcome.append("timed out")

    with gpu_lock(uuid, directory=tmp_path), gpu_lock(uuid, timeout_s=0.1, directory=tmp_path):
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
    assert outcome == ["timed out"]
    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert outcome == ["timed out", "acquired"]


def test_lock_file_name_is_per_uuid(tmp_path: Path) -> None:
    a = lock_path("GPU-aaaa", tmp_path)
    b = lock_path("MIG-bbbb/1", tmp_path)
    assert a != b
    assert a.parent == b.parent == tmp_path
    assert "/" not in b.name
