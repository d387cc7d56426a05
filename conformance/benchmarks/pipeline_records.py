"""The records of suite ``pipelines`` (``conformance/benchmarks/pipelines.py``, whose docstring says what each
figure means and how it is measured), built from what a run counted and measured: pure functions, no GPU.

* :func:`latency_record` — ``pipelines[<p>-float32-<mode>]``: wall clock per run, runtime-counted bytes;
* :func:`pcie_record` — ``pipelines[<p>-float32-<mode>-pcie]``: NVML bytes per run, against the runtime's
  count;
* :func:`saving_record` — ``pipelines[<p>-float32-<mode>_saving[-<method>]]``: bytes per run (or per execute
  of one method) that a mode saved against ``copy``, counted and measured, and their agreement.

Inputs: :class:`RunBytes` (sums of ``execute_stats`` rows, :func:`runtime_bytes`), ``PerRunTraffic`` (NVML,
``conformance/common/pcie_checks.py``) and :class:`PerCopy` (the fixed PCIe cost of the copies a mode saved).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conformance.benchmarks import BenchPipeline, exact_metric, ratio_metric
from conformance.common.pcie_checks import RESOLUTION_FACTOR, PerRunTraffic, difference
from harness.records import BenchRecord, Metric, case_name
from harness.timing import Measurement

__all__ = [
    "AGREEMENT",
    "DTYPE_NAME",
    "PLACED_OPTIONS",
    "SUITE",
    "PerCopy",
    "RunBytes",
    "latency_record",
    "params_for",
    "pcie_record",
    "per_method_saving",
    "runtime_bytes",
    "saving_record",
]

#: NVML bytes over the runtime's count: 1 is exact agreement, neither direction is "better".
AGREEMENT = "near-1"
SUITE = "pipelines"
DTYPE_NAME = "float32"
#: Export-time placement of the ``placed`` mode: every input and output of both methods on the device.
PLACED_OPTIONS = {"skip_h2d_for_method_inputs": True, "skip_d2h_for_method_outputs": True}


@dataclass(frozen=True)
class RunBytes:
    """What the runtime counted over one pipeline run: sums of ``execute_stats`` rows."""

    h2d: int
    d2h: int
    executes: int
    per_method: dict[str, dict[str, int]] = field(default_factory=dict)


def runtime_bytes(stats: Sequence[tuple[str, dict[str, int]]]) -> RunBytes:
    """Sum the per-execute rows (``conformance.common.pipelines.CallStats``) of one run, also per method."""
    per_method: dict[str, dict[str, int]] = {}
    for method, row in stats:
        entry = per_method.setdefault(method, {"calls": 0, "h2d_bytes": 0, "d2h_bytes": 0})
        entry["calls"] += 1
        entry["h2d_bytes"] += int(row.get("h2d_bytes", 0))
        entry["d2h_bytes"] += int(row.get("d2h_bytes", 0))
    return RunBytes(
        h2d=sum(e["h2d_bytes"] for e in per_method.values()),
        d2h=sum(e["d2h_bytes"] for e in per_method.values()),
        executes=len(stats),
        per_method=per_method,
    )


def _nvml_metric(value: float | None, noise: float | None, traffic: PerRunTraffic, better: str) -> Metric:
    if value is None:
        return Metric.missing("B", better, traffic.why_missing)
    return Metric(unit="B", value=value, spread=noise, better=better, n=1, note=traffic.note())


def params_for(pipeline: str, mode: str) -> dict[str, str]:
    return {"pipeline": pipeline, "dtype": DTYPE_NAME, "mode": mode}


def latency_record(
    pipeline: BenchPipeline,
    mode: str,
    latency: Measurement,
    counted: RunBytes,
    speed_vs_copy: Measurement | None = None,
) -> BenchRecord:
    params = params_for(pipeline.name, mode)
    metrics = {
        "latency": latency.to_metric("lower"),
        "runtime_d2h_bytes": exact_metric(counted.d2h, "B"),
        "runtime_h2d_bytes": exact_metric(counted.h2d, "B"),
    }
    if speed_vs_copy is not None:
        metrics["speed_vs_copy"] = speed_vs_copy.to_metric("higher")
    return BenchRecord(
        suite=SUITE,
        name=case_name(SUITE, params),
        params=params,
        primary="latency",
        metrics=metrics,
        conditions={
            **latency.conditions,
            "pipeline": pipeline.description,
            "skip_copy_option": pipeline.option_value(mode),
            "executes_per_run": counted.executes,
            "runtime_bytes_per_method": counted.per_method,
            "timing": "wall clock per whole run, device synchronised at the end; no L2 flush",
            "converged": latency.converged,
            "stop_reason": latency.stop_reason,
            "spread": "IQR over repeats; speed_vs_copy from per-round ratios (modes interleaved)",
        },
    )


def pcie_record(
    pipeline: BenchPipeline,
    mode: str,
    traffic: PerRunTraffic,
    counted: RunBytes,
    runs_reason: str,
    meter: dict[str, Any] | None = None,
) -> BenchRecord:
    params = {**params_for(pipeline.name, mode), "measure": "pcie"}
    missing = traffic.why_missing
    return BenchRecord(
        suite=SUITE,
        name=case_name(SUITE, params),
        params=params,
        primary="nvml_d2h_bytes",
        metrics={
            "nvml_d2h_bytes": _nvml_metric(traffic.d2h, traffic.d2h_noise, traffic, "lower"),
            "nvml_h2d_bytes": _nvml_metric(traffic.h2d, traffic.h2d_noise, traffic, "lower"),
            "runtime_d2h_bytes": exact_metric(counted.d2h, "B"),
            "runtime_h2d_bytes": exact_metric(counted.h2d, "B"),
            **{
                f"{d}_agreement": ratio_metric(
                    getattr(traffic, d),
                    getattr(traffic, f"{d}_noise"),
                    getattr(counted, d),
                    what=what,
                    missing_reason=missing,
                    better=AGREEMENT,
                )
                for d, what in (("d2h", "device→host"), ("h2d", "host→device"))
            },
        },
        conditions={
            "valid": traffic.valid,
            "reason": traffic.reason,
            "runs_per_window": traffic.runs,
            "runs_chosen_by": runs_reason,
            "counted_bytes_per_run": {"h2d": traffic.h2d_counted, "d2h": traffic.d2h_counted},
            "window": traffic.window,
            "meter": meter or {},
            "skip_copy_option": pipeline.option_value(mode),
            "note": (
                "NVML bytes are per run: K back-to-back runs measured in one TrafficMeter window and divided "
                "by K, because one run moves only KBs, below the counters' noise. NVML also counts the "
                "loop's own torch copies and launch/sync traffic, which the runtime counters do not."
            ),
            "spread": "NVML: drift noise of the window plus calibration noise, divided by K",
        },
    )


@dataclass(frozen=True)
class PerCopy:
    """The copies a mode saved per execute (``h2d_copy``: host inputs no longer copied in; ``d2h_copy``:
    outputs no longer copied out) and what one small pinned copy of each kind moves on PCIe beyond its
    payload, per direction (``overheads[kind][direction]``, NVML bytes; the copy's commands, completion)."""

    copies_saved: Mapping[str, int]
    overheads: Mapping[str, Mapping[str, float | None]] | None
    why_missing: str | None = None

    def expected(self, direction: str, counted: int) -> float | None:
        """The runtime's saving in ``direction`` plus the fixed costs of the copies saved."""
        if self.overheads is None:
            return None
        extra = 0.0
        for kind, n in self.copies_saved.items():
            cost = self.overheads.get(kind, {}).get(direction)
            if n and cost is None:
                return None
            extra += n * (cost or 0.0)
        return counted + extra

    def note(self) -> str:
        return f"runtime saving + copies saved {dict(self.copies_saved)} x per-copy PCIe cost (this run)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "copies_saved": dict(self.copies_saved),
            "overheads": self.overheads,
            "reason": self.why_missing,
        }


def saving_record(
    pipeline: BenchPipeline,
    copy_counted: RunBytes,
    skip_counted: RunBytes,
    copy_traffic: PerRunTraffic,
    skip_traffic: PerRunTraffic,
    mode: str = "skip_copy",
    method: str | None = None,
    loop: Mapping[str, PerRunTraffic] | None = None,
    per_copy: PerCopy | None = None,
) -> BenchRecord:
    """Bytes per run that ``mode`` saved (copy − mode), runtime-counted and NVML-measured; with ``method``,
    per execute of that method alone (its own NVML windows, so the loop's traffic is not in them); with
    ``loop`` (per mode, the loop replayed alone), the traffic figures given are net of it and the loop's
    bytes per run are in the conditions.

    An agreement is only given where the saving is resolvable: at least ``RESOLUTION_FACTOR`` times the
    NVML noise of the difference; below that the metric is missing and says the meter's resolution.

    ``per_copy``: the copies the mode saved and what one small pinned copy costs on PCIe beyond its payload
    (measured in the same run); then ``*_saved_expected_nvml`` is the runtime's saving plus those fixed
    costs, and ``*_saved_agreement_per_copy`` holds NVML to it (a small saving is mostly fixed costs)."""
    params = params_for(pipeline.name, f"{mode}_saving")
    if method is not None:
        params["method"] = method
    missing = copy_traffic.why_missing if copy_traffic.d2h is None else skip_traffic.why_missing
    metrics: dict[str, Metric] = {}
    for direction, label in (("d2h", "device→host"), ("h2d", "host→device")):
        counted = getattr(copy_counted, direction) - getattr(skip_counted, direction)
        nvml, noise = difference(copy_traffic, skip_traffic, direction)
        saving = _Saving(direction, label, counted, nvml, noise, missing, "execute" if method else "run")
        metrics.update(_saving_metrics(saving, copy_traffic.runs))
        if per_copy is not None:
            metrics.update(_per_copy_metrics(saving, per_copy))
    return BenchRecord(
        suite=SUITE,
        name=case_name(SUITE, params),
        params=params,
        primary="d2h_saved_nvml",
        metrics=metrics,
        conditions=_saving_conditions(
            pipeline, copy_counted, skip_counted, copy_traffic, skip_traffic, mode, loop, per_copy
        ),
    )


@dataclass(frozen=True)
class _Saving:
    """One direction's saving: runtime-counted (``counted``) and NVML-measured (``nvml`` ± ``noise``, None
    with the reason ``missing``), per ``unit`` (``run`` or ``execute``)."""

    direction: str
    label: str
    counted: int
    nvml: float | None
    noise: float | None
    missing: str | None
    unit: str

    @property
    def resolution(self) -> float | None:
        """The smallest saving the meter resolves here: ``RESOLUTION_FACTOR`` × the difference's noise."""
        return None if self.noise is None else RESOLUTION_FACTOR * self.noise


def _saving_metrics(saving: _Saving, runs: int) -> dict[str, Metric]:
    """``<d>_saved_nvml``, ``<d>_saved_runtime`` and their agreement (missing below the resolution);
    ``runs``: the runs per NVML window."""
    d, nvml, noise, counted = saving.direction, saving.nvml, saving.noise, saving.counted
    metrics = {
        f"{d}_saved_nvml": (
            Metric.missing("B", "higher", saving.missing)
            if nvml is None
            else Metric(
                unit="B",
                value=nvml,
                spread=noise,
                better="higher",
                n=1,
                note=f"difference of two windows of {runs} runs each, per run",
            )
        ),
        f"{d}_saved_runtime": exact_metric(counted, "B", better="higher"),
    }
    resolution = saving.resolution
    if resolution is not None and counted and abs(counted) < resolution:
        metrics[f"{d}_saved_agreement"] = Metric.missing(
            "x",
            AGREEMENT,
            f"{saving.label} saving of {counted:,} B per {saving.unit} is below the meter's "
            f"resolution here ({resolution:,.0f} B = {RESOLUTION_FACTOR:g} x its noise {noise:,.0f} B)",
        )
    else:
        metrics[f"{d}_saved_agreement"] = ratio_metric(
            nvml,
            noise,
            counted,
            what=f"{saving.label} saving",
            missing_reason=saving.missing,
            better=AGREEMENT,
        )
    return metrics


def _per_copy_metrics(saving: _Saving, per_copy: PerCopy) -> dict[str, Metric]:
    """``<d>_saved_expected_nvml`` (the runtime's saving plus the fixed costs of the copies saved) and
    ``<d>_saved_agreement_per_copy`` (NVML against it; missing below the resolution)."""
    d, label, resolution = saving.direction, saving.label, saving.resolution
    expected = per_copy.expected(d, saving.counted)
    metrics = {
        f"{d}_saved_expected_nvml": (
            Metric.missing("B", "higher", per_copy.why_missing or "no per-copy cost measured")
            if expected is None
            else Metric(unit="B", value=expected, spread=None, better="higher", n=1, note=per_copy.note())
        )
    }
    if expected is not None and resolution is not None and expected and abs(expected) < resolution:
        metrics[f"{d}_saved_agreement_per_copy"] = Metric.missing(
            "x",
            AGREEMENT,
            f"{label} expected saving below the meter's resolution ({resolution:,.0f} B)",
        )
    else:
        metrics[f"{d}_saved_agreement_per_copy"] = ratio_metric(
            saving.nvml,
            saving.noise,
            expected,
            what=f"{label} expected saving",
            missing_reason=saving.missing,
            better=AGREEMENT,
        )
    return metrics


def _saving_conditions(
    pipeline: BenchPipeline,
    copy_counted: RunBytes,
    skip_counted: RunBytes,
    copy_traffic: PerRunTraffic,
    skip_traffic: PerRunTraffic,
    mode: str,
    loop: Mapping[str, PerRunTraffic] | None,
    per_copy: PerCopy | None,
) -> dict[str, Any]:
    """The conditions of a saving record: the mechanism, per-method runtime savings, validity, and how the
    NVML figures were made (net of the loop's own traffic, with ``loop``)."""
    return {
        "mechanism": "export-time placement" if mode == "placed" else "runtime option",
        "skip_copy_option": pipeline.skip_methods if mode == "skip_copy" else "",
        "placement": PLACED_OPTIONS if mode == "placed" else {},
        "runtime_saved_per_method": per_method_saving(copy_counted, skip_counted),
        "valid": copy_traffic.valid and skip_traffic.valid,
        "reasons": {"copy": copy_traffic.reason, mode: skip_traffic.reason},
        "runs_per_window": copy_traffic.runs,
        "note": (
            f"saved = copy mode minus {mode} mode, per run; NVML figures from K-run windows divided "
            "by K; agreement = NVML saving / runtime saving (traffic common to both modes cancels)"
            + ("; NVML figures net of the loop's own traffic, replayed alone per mode" if loop else "")
        ),
        **({"loop_bytes_per_run": _loop_bytes(loop, ("copy", mode))} if loop else {}),
        **({"per_copy": per_copy.to_dict()} if per_copy is not None else {}),
    }


def _loop_bytes(loop: Mapping[str, PerRunTraffic], modes: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The loop's own NVML bytes per run in each mode (what the whole-run savings were made net of)."""
    return {
        mode: {"h2d": loop[mode].h2d, "d2h": loop[mode].d2h, "valid": loop[mode].valid}
        for mode in modes
        if mode in loop
    }


def per_method_saving(copy_counted: RunBytes, other: RunBytes) -> dict[str, dict[str, int]]:
    """Runtime-counted bytes per run each method saved (copy − other), per direction."""
    return {
        method: {
            key: row[key] - other.per_method.get(method, {}).get(key, 0) for key in ("h2d_bytes", "d2h_bytes")
        }
        for method, row in copy_counted.per_method.items()
    }
