"""Device memory and DRAM bandwidth as NVML reports them: memory info (v2 where the driver has it) and
GPM's DRAM bandwidth utilisation over a window (Hopper or newer), each ``None`` with a reason where
unsupported."""

from __future__ import annotations

import contextlib
import math
from typing import Any

from harness.gpu_state import describe_error


def device_memory(pynvml: Any, handle: Any) -> dict[str, Any]:
    """NVML memory info, v2 where the driver has it (its ``used`` excludes driver-reserved memory)."""
    version = getattr(pynvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            return {
                "nvml_memory_info": "v2",
                "used_bytes": int(info.used),
                "reserved_bytes": int(info.reserved),
                "total_bytes": int(info.total),
            }
        except Exception:
            pass  # older driver: fall back to v1
    try:
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
    except Exception as exc:
        return {"nvml_memory_info": None, "reason": describe_error(exc)}
    return {"nvml_memory_info": "v1", "used_bytes": int(info.used), "total_bytes": int(info.total)}


class GpmDramBandwidth:
    """DRAM bandwidth utilisation (% of peak) between ``begin`` and ``end`` via GPM, where supported."""

    def __init__(self, pynvml: Any, handle: Any) -> None:
        self._nvml = pynvml
        self._handle = handle
        self._first: Any = None
        self.reason: str | None = None
        try:
            if not pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                self.reason = "GPM not supported on this device (needs Hopper or newer, no MIG)"
        except Exception as exc:
            self.reason = f"GPM unavailable: {describe_error(exc)}"

    @property
    def supported(self) -> bool:
        return self.reason is None

    def begin(self) -> None:
        if self.supported:
            try:
                self._first = self._nvml.nvmlGpmSampleGet(self._handle, self._nvml.nvmlGpmSampleAlloc())
            except Exception as exc:
                self.reason = f"GPM sample failed: {describe_error(exc)}"

    def end(self) -> float | None:
        if not self.supported or self._first is None:
            return None
        nvml = self._nvml
        second = None
        try:
            second = nvml.nvmlGpmSampleGet(self._handle, nvml.nvmlGpmSampleAlloc())
            query = nvml.c_nvmlGpmMetricsGet_t()
            query.version = nvml.NVML_GPM_METRICS_GET_VERSION
            query.numMetrics = 1
            query.sample1 = self._first
            query.sample2 = second
            query.metrics[0].metricId = nvml.NVML_GPM_METRIC_DRAM_BW_UTIL
            nvml.nvmlGpmMetricsGet(query)
            metric = query.metrics[0]
            if metric.nvmlReturn != nvml.NVML_SUCCESS:
                self.reason = f"GPM DRAM_BW_UTIL: {describe_error(nvml.NVMLError(metric.nvmlReturn))}"
                return None
            value = float(metric.value)
            if not math.isfinite(value):
                # Seen on an H200 for a 46 ms window: GPM answers success with NaN. Unsupported, not 0.
                self.reason = "GPM DRAM_BW_UTIL returned no finite value for this window"
                return None
            return value
        except Exception as exc:
            self.reason = f"GPM metrics failed: {describe_error(exc)}"
            return None
        finally:
            for sample in (self._first, second):
                if sample is not None:
                    # A failed free leaks a few bytes; nothing measured depends on it.
                    with contextlib.suppress(Exception):
                        nvml.nvmlGpmSampleFree(sample)
            self._first = None
