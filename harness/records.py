"""The shape of one benchmark or traffic figure in the result file (``run.benchmarks`` / ``run.traffic``).

One record per measured case::

    {"suite": "mm_out", "name": "mm_out[bfloat16-8192x8192x8192]",
     "params": {"dtype": "bfloat16", "shape": "8192x8192x8192"},
     "primary": "time",
     "metrics": {"time": {"unit": "s", "value": 0.00123, "spread": 0.00001, "n": 50, "better": "lower"}},
     "conditions": {"sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "throttle_reasons": [],
                    "gpu_uuid": "GPU-..."}}

``value`` is the median, ``spread`` the interquartile range (or another noise figure, named in the
suite's docs) in the same unit. A figure that could not be measured has ``value: null`` and a ``note``
saying why (the dashboard shows it in place of the number); it is never reported as 0. The dashboard
renders exactly this shape: extend it only with optional keys.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Which values of a metric are better: ``lower``, ``higher``, or ``near-1`` (a ratio that should be 1, e.g.
#: NVML's bytes over the runtime's count: neither direction is better, closeness to 1 is).
BETTER = ("lower", "higher", "near-1")


class RecordError(ValueError):
    """A record that does not have the documented shape; the message names the field."""


@dataclass(frozen=True)
class Metric:
    """One figure with its unit and noise: ``value`` is the median, ``spread`` the IQR or noise figure."""

    unit: str
    value: float | None
    spread: float | None
    better: str
    n: int | None = None
    note: str | None = None  # why value is None (required then); the dashboard shows it

    def __post_init__(self) -> None:
        if self.better not in BETTER:
            raise RecordError(f"metric better={self.better!r} must be one of {BETTER}")
        if not self.unit:
            raise RecordError("metric unit must be a non-empty string (every figure has a unit)")
        if self.value is None and not self.note:
            raise RecordError(
                "a metric without a value needs a note saying why (never report 'unsupported' as 0)"
            )
        for name in ("value", "spread"):
            number = getattr(self, name)
            if number is not None and not math.isfinite(number):
                raise RecordError(f"metric {name}={number!r} must be finite (use None with a note)")

    @classmethod
    def missing(cls, unit: str, better: str, note: str) -> Metric:
        return cls(unit=unit, value=None, spread=None, better=better, note=note)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"unit": self.unit, "value": self.value, "spread": self.spread}
        if self.n is not None:
            out["n"] = self.n
        out["better"] = self.better
        if self.note is not None:
            out["note"] = self.note
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "metric") -> Metric:
        _need(data, where, ("unit", "value", "spread", "better"))
        return cls(
            unit=str(data["unit"]),
            value=_number_or_none(data["value"], f"{where}.value"),
            spread=_number_or_none(data["spread"], f"{where}.spread"),
            better=str(data["better"]),
            n=data.get("n"),
            note=data.get("note"),
        )


@dataclass(frozen=True)
class BenchRecord:
    """One measured case: what it was (suite, name, params), its figures, and the conditions it ran under."""

    suite: str
    name: str
    params: dict[str, str]
    primary: str
    metrics: dict[str, Metric]
    conditions: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.primary not in self.metrics:
            raise RecordError(
                f"{self.name}: primary metric {self.primary!r} is not among {list(self.metrics)}"
            )
        for key, value in self.params.items():
            if not isinstance(value, str):
                raise RecordError(
                    f"{self.name}: params[{key!r}] must be a string, found {type(value).__name__}"
                )

    def to_dict(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "name": self.name,
            "params": dict(self.params),
            "primary": self.primary,
            "metrics": {key: metric.to_dict() for key, metric in self.metrics.items()},
            "conditions": dict(self.conditions),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchRecord:
        _need(data, "record", ("suite", "name", "params", "primary", "metrics"))
        name = str(data["name"])
        metrics = data["metrics"]
        if not isinstance(metrics, Mapping):
            raise RecordError(f"{name}: metrics must be an object")
        return cls(
            suite=str(data["suite"]),
            name=name,
            params=dict(data["params"]),
            primary=str(data["primary"]),
            metrics={k: Metric.from_dict(v, f"{name}.metrics.{k}") for k, v in metrics.items()},
            conditions=dict(data.get("conditions") or {}),
        )


def case_name(suite: str, params: Mapping[str, str]) -> str:
    """``mm_out[bfloat16-8192x8192x8192]``: the suite and the param values in order, like a pytest id."""
    return f"{suite}[{'-'.join(params.values())}]"


def _need(data: Mapping[str, Any], where: str, keys: tuple[str, ...]) -> None:
    if not isinstance(data, Mapping):
        raise RecordError(f"{where} must be an object, found {type(data).__name__}")
    missing = [key for key in keys if key not in data]
    if missing:
        raise RecordError(f"{where}: missing field(s) {', '.join(missing)}")


def _number_or_none(value: object, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RecordError(f"{where} must be a number or null, found {type(value).__name__}")
    return float(value) if isinstance(value, float) else value
