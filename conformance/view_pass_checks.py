"""Observing a graph as a caller would, and the view-pass checks built on it (SPEC §1a).

A view-copy pass is right when nobody can tell its result from its input graph. What "tell" means is
written once, here: :func:`observe` runs a graph on fresh clones of its inputs and records everything a
caller could see (outputs, the inputs' final values, and which outputs share memory with an input or with
another output); :func:`differences` says, in words, what differs between two such observations.
:func:`meta_mismatches` holds ``meta["val"]`` (what later passes and the compiler trust) against a real run.
:func:`force_view_twins` is what a pass without safety rules would do, so the suite can prove its own
catalogue (:func:`forcing_differences`). The ``assert_*`` helpers turn findings into ``[rule] call: ...``
failures (``conformance.checks``' format) for the lowering chapter.

Kept apart from ``conformance/checks.py`` because all of it is about fx graphs and the view pass (the
generic tensor checks do not need torch.fx), and apart from ``conformance/view_pass_cases.py`` so that the
catalogue holds case definitions only. No backend is imported here.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Interpreter, Node

from conformance.checks import bits, fail
from conformance.view_pass_cases import is_view_op, view_twin

__all__ = [
    "Observation",
    "assert_same_behaviour",
    "assert_truthful_meta",
    "differences",
    "force_view_twins",
    "forcing_differences",
    "meta_mismatches",
    "observe",
    "views_in_result",
]

_Inputs = tuple[torch.Tensor, ...]


# ============================================================================================ observing


@dataclass(frozen=True)
class Observation:
    """What a caller can see of one run: values (outputs, then the inputs' final values) and sharing.

    ``shared`` holds ``(written, changed)`` label pairs: writing the output ``written`` after the run changed
    ``changed`` too (an input or another output), i.e. they share memory. ``error`` is set if the run raised.
    """

    labels: tuple[str, ...]
    values: tuple[torch.Tensor, ...]
    shared: frozenset[tuple[str, str]]
    error: str | None = None


def _flatten(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _flatten(item)
    elif isinstance(value, torch.Tensor):
        yield value


def _poke(t: torch.Tensor) -> None:
    if t.dtype is torch.bool:
        t.logical_not_()
    else:
        t.add_(1)


def observe(module: Callable[..., Any], inputs: _Inputs) -> Observation:
    """Run ``module`` on fresh clones of ``inputs``; then write each output in turn to see what it shares."""
    fresh = [t.clone() for t in inputs]
    try:
        outputs = list(_flatten(module(*fresh)))
    except Exception as exc:  # a broken graph is an observation too
        return Observation((), (), frozenset(), f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
    labels = (*(f"output {i}" for i in range(len(outputs))), *(f"input {i}" for i in range(len(fresh))))
    live = [*outputs, *fresh]
    values = tuple(t.detach().clone() for t in live)
    shared: set[tuple[str, str]] = set()
    for i in range(len(outputs)):
        before = [bits(t).clone() for t in live]
        try:
            _poke(live[i])
        except RuntimeError:  # e.g. an expanded view: several elements share one memory location
            shared.add((labels[i], labels[i]))
            continue
        shared.update(
            (labels[i], labels[j])
            for j, t in enumerate(live)
            if j != i and not torch.equal(bits(t), before[j])
        )
    return Observation(labels, values, frozenset(shared))


def differences(expected: Observation, got: Observation, *, tolerance: float = 0.0) -> list[str]:
    """What differs between two observations, in words; empty when a caller could not tell them apart.

    Values must be bitwise equal (so -0.0 is not 0.0, and a NaN matches only the same NaN), unless
    ``tolerance`` > 0: then, in float64, each element may differ by ``tolerance × (1 + |expected|)``
    (relative to its magnitude, absolute near zero); NaN matches NaN and an infinity itself.
    """
    if expected.error or got.error:
        same = expected.error == got.error
        return [] if same else [f"run raised {got.error!r} (expected {expected.error!r})"]
    if expected.labels != got.labels:
        return [f"returned {len(got.labels)} values (outputs and inputs), expected {len(expected.labels)}"]
    found = []
    for label, want, have in zip(expected.labels, expected.values, got.values, strict=True):
        if want.shape != have.shape or want.dtype != have.dtype:
            found.append(f"{label}: {have.dtype}{list(have.shape)}, expected {want.dtype}{list(want.shape)}")
            continue
        if tolerance > 0:
            # float64, so the bound is the documented one and not rounded in the tensors' own dtype.
            close = torch.isclose(
                have.double(), want.double(), rtol=tolerance, atol=tolerance, equal_nan=True
            )
            diff = ~close
        else:
            diff = bits(want) != bits(have)
        if bool(diff.any()):
            where = tuple(int(i) for i in diff.nonzero()[0]) if have.dim() else ()
            found.append(
                f"{label}: {int(diff.sum())} of {have.numel()} elements differ; first at {where}: "
                f"got {have[where].item()!r}, expected {want[where].item()!r}"
            )
    for written, changed in sorted(got.shared - expected.shared):
        found.append(f"writing {written} after the call changes {changed}: they now share memory")
    for written, changed in sorted(expected.shared - got.shared):
        found.append(f"writing {written} after the call no longer changes {changed}")
    return found


# ============================================================================================ a pass's result


def force_view_twins(module: GraphModule, only: Collection[str] | None = None) -> GraphModule:
    """What a pass without safety rules would do: every ``*_copy`` with a view twin (or only those named
    in ``only``) becomes that view. ``meta`` is left as it was: this is for running, not for compiling."""
    forced = copy.deepcopy(module)
    for n in forced.graph.nodes:
        twin = view_twin(n.target)
        if n.op == "call_function" and twin is not None and (only is None or n.name in only):
            n.target = twin
    forced.recompile()
    return forced


def forcing_differences(module: GraphModule, inputs: _Inputs, only: Collection[str]) -> list[str]:
    """What a caller would see change if exactly the copies named in ``only`` became their views."""
    return differences(observe(module, inputs), observe(force_view_twins(module, only), inputs))


def _nodes(module: GraphModule) -> dict[str, Node]:
    return {n.name: n for n in module.graph.nodes}


def views_in_result(original: GraphModule, result: GraphModule) -> set[str]:
    """Copies of ``original`` (nodes with a view twin) that are view ops in ``result``, matched by node
    name: what a pass really rewrote, whatever it reports."""
    after = _nodes(result)
    return {
        name
        for name, n in _nodes(original).items()
        if view_twin(n.target) is not None and name in after and is_view_op(after[name].target)
    }


def _flat(value: Any) -> list[Any]:
    return [v for item in value for v in _flat(item)] if isinstance(value, (list, tuple)) else [value]


class _Recorder(Interpreter):
    """Runs a graph on real tensors and keeps the values of the named nodes."""

    def __init__(self, module: GraphModule, names: set[str]) -> None:
        super().__init__(module)
        self.names = names
        self.values: dict[str, Any] = {}

    def run_node(self, n: Node) -> Any:
        result = super().run_node(n)
        if n.name in self.names:
            self.values[n.name] = result
        return result


def _layout(t: torch.Tensor) -> tuple[Any, ...]:
    """What decides where each element lives: the shape, the strides of dimensions of size > 1 and the
    storage offset. A size-1 dimension is only ever indexed at 0, so its stride addresses nothing (torch
    itself calls ``(2, 1, 32)`` with strides ``(32, 8, 1)`` contiguous), and an empty tensor has no
    elements to place: reporting those would fail a pass for a layout no kernel can tell apart."""
    if t.numel() == 0:
        return (tuple(t.shape),)
    strides = tuple(s for s, n in zip(t.stride(), t.shape, strict=True) if n > 1)
    return tuple(t.shape), strides, t.storage_offset()


def meta_mismatches(module: GraphModule, inputs: _Inputs, names: set[str]) -> list[str]:
    """Named nodes whose ``meta["val"]`` disagrees with a real run on where an element lives: shape,
    strides (of dimensions of size > 1) or storage offset."""
    recorder = _Recorder(module, names)
    recorder.run(*[t.clone() for t in inputs])
    nodes = _nodes(module)
    found = []
    for name in sorted(names):
        fake = nodes[name].meta.get("val")
        if fake is None:
            found.append(f"{name} has no meta['val']")
            continue
        for fake_t, real_t in zip(_flat(fake), _flat(recorder.values[name]), strict=False):
            if _layout(fake_t) != _layout(real_t):
                meta = (tuple(fake_t.shape), fake_t.stride(), fake_t.storage_offset())
                real = (tuple(real_t.shape), real_t.stride(), real_t.storage_offset())
                found.append(f"{name}: meta (shape, strides, offset) {meta}, real run {real}")
    return found


# ============================================================================================ assertions


def assert_same_behaviour(
    rule: str,
    call: str,
    original: GraphModule,
    result: GraphModule,
    inputs: _Inputs,
    *,
    tolerance: float = 0.0,
) -> None:
    """A caller cannot tell ``result`` from ``original`` on ``inputs`` (see :func:`differences`)."""
    found = differences(observe(original, inputs), observe(result, inputs), tolerance=tolerance)
    if found:
        fail(rule, call, "the result behaves differently: " + "; ".join(found))


def assert_truthful_meta(rule: str, call: str, module: GraphModule, inputs: _Inputs, names: set[str]) -> None:
    """Every node of ``names`` has the shape, strides and storage offset in ``meta["val"]`` that it has in a
    real run (see :func:`meta_mismatches`)."""
    found = meta_mismatches(module, inputs, names)
    if found:
        fail(rule, call, "; ".join(found))
