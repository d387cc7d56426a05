"""Which GPU a figure was taken on and what state it was in: NVML session, UUID mapping, clocks, throttling.

NVML ignores ``CUDA_VISIBLE_DEVICES`` (its index 0 is the first physical GPU), so a torch device index is
never used as an NVML index: torch's device UUID is looked up in NVML instead. Every probe is guarded; a
machine without a driver gets ``None`` values and a reason, never zeros.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# Bit → name of NVML's clocks event (throttle) reasons; the values are fixed by nvml.h.
THROTTLE_REASON_BITS: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
    0x200: "board_limit",
    0x400: "reliability",
}


class NvmlUnavailable(RuntimeError):
    """NVML (or the one query asked of it) cannot answer here; the message says why."""


def describe_error(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def decode_throttle_reasons(mask: int) -> list[str]:
    """Names of the set bits, low bit first; unknown bits are kept as hex so nothing is hidden."""
    names = [name for bit, name in THROTTLE_REASON_BITS.items() if mask & bit]
    unknown = mask & ~sum(THROTTLE_REASON_BITS)
    if unknown:
        names.append(f"unknown_0x{unknown:x}")
    return names


def format_uuid(raw: object) -> str:
    """torch prints a bare UUID; NVML says ``GPU-<uuid>`` (or ``MIG-...``). Use NVML's form."""
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def torch_device_uuid(device_index: int) -> str:
    """The NVML-form UUID of torch's ``cuda:<device_index>`` (which honours CUDA_VISIBLE_DEVICES)."""
    import torch

    if not torch.cuda.is_available():
        raise NvmlUnavailable("no CUDA device: torch.cuda.is_available() is False")
    uuid = getattr(torch.cuda.get_device_properties(device_index), "uuid", None)
    if uuid is None:
        raise NvmlUnavailable(f"torch {torch.__version__} does not expose the device UUID")
    return format_uuid(uuid)


# ---------------------------------------------------------------------------------------------- NVML session

_init_lock = threading.Lock()
_nvml: list[Any] = []  # the initialised pynvml module, once it has initialised


@contextlib.contextmanager
def nvml_session() -> Iterator[Any]:
    """Yield the ``pynvml`` module with NVML initialised.

    NVML is initialised once per process and shut down at exit: nvmlInit enumerates every GPU and can
    take tens of milliseconds, too slow to repeat for each figure's clock reading.
    """
    with _init_lock:
        if not _nvml:
            _nvml.append(_initialise())
    yield _nvml[0]


def _initialise() -> Any:
    try:
        import pynvml
    except Exception as exc:
        raise NvmlUnavailable(f"pynvml (nvidia-ml-py) is not importable: {describe_error(exc)}") from exc
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        raise NvmlUnavailable(f"NVML did not initialise: {describe_error(exc)}") from exc
    atexit.register(_shutdown, pynvml)
    return pynvml


def _shutdown(pynvml: Any) -> None:
    with contextlib.suppress(Exception):  # a failed shutdown at exit changes nothing we measured
        pynvml.nvmlShutdown()


def nvml_handle(pynvml: Any, uuid: str) -> Any:
    try:
        return pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except Exception as exc:
        raise NvmlUnavailable(f"NVML has no device with UUID {uuid}: {describe_error(exc)}") from exc


# ---------------------------------------------------------------------------------------------- GPU state


@dataclass(frozen=True)
class GpuState:
    """Clocks and throttle reasons at one moment: the ``conditions`` of a figure."""

    gpu_uuid: str | None
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    throttle_reasons: list[str] | None
    temperature_c: int | None = None
    power_w: float | None = None
    errors: dict[str, str] = field(default_factory=dict)  # query → why it has no value

    def to_conditions(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "sm_clock_mhz": self.sm_clock_mhz,
            "mem_clock_mhz": self.mem_clock_mhz,
            "throttle_reasons": self.throttle_reasons,
            "gpu_uuid": self.gpu_uuid,
        }
        if self.temperature_c is not None:
            out["temperature_c"] = self.temperature_c
        if self.power_w is not None:
            out["power_w"] = self.power_w
        if self.errors:
            out["state_errors"] = dict(self.errors)
        return out


def capture_gpu_state(device_index: int) -> GpuState:
    """Clocks, throttle reasons, temperature and power of torch's ``cuda:<device_index>``, right now."""
    try:
        uuid = torch_device_uuid(device_index)
    except Exception as exc:
        return _unknown_state(None, describe_error(exc))
    try:
        with nvml_session() as pynvml:
            return _query_state(pynvml, nvml_handle(pynvml, uuid), uuid)
    except NvmlUnavailable as exc:
        return _unknown_state(uuid, str(exc))


def _unknown_state(uuid: str | None, reason: str) -> GpuState:
    return GpuState(uuid, None, None, None, errors={"nvml": reason})


def _query_state(pynvml: Any, handle: Any, uuid: str) -> GpuState:
    errors: dict[str, str] = {}

    def ask(name: str, query: Any) -> Any:
        try:
            return query()
        except Exception as exc:
            errors[name] = describe_error(exc)
            return None

    sm = ask("sm_clock", lambda: int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)))
    mem = ask("mem_clock", lambda: int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)))
    mask = ask("throttle_reasons", lambda: _throttle_mask(pynvml, handle))
    temp = ask(
        "temperature", lambda: int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))
    )
    power = ask("power", lambda: round(pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, 1))
    reasons = None if mask is None else decode_throttle_reasons(int(mask))
    return GpuState(uuid, sm, mem, reasons, temp, power, errors)


def _throttle_mask(pynvml: Any, handle: Any) -> int:
    # The "event reasons" name replaced "throttle reasons" in newer drivers; same bits.
    query = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if query is not None:
        try:
            return int(query(handle))
        except Exception as exc:
            if "Function Not Found" not in str(exc):
                raise
    return int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
