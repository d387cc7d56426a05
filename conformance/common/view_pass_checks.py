"""Observing a graph as a caller would, and the view-pass checks built on it (SPEC §1a).

A view-copy pass is right when nobody can tell its result from its input graph. What "tell" means is
written once, here: :func:`observe` runs a graph on fresh clones of its inputs and records everything a
caller could see (outputs, the inputs' final values, and which outputs share memory with an input or with
another output); :func:`differences` says, in words, what differs between two such observations.
:func:`meta_mismatches` holds ``meta["val"]`` (what later passes and the compiler trust) against a real run.
:func:`force_view_twins` is what a pass without safety rules would do, so the suite can prove its own
catalogue (:func:`forcing_differences`). The ``assert_*`` helpers turn findings into ``[rule] call: ...``
failures (``conformance.common.checks``' format) for the lowering chapter.

Kept apart from ``conformance/common/checks.py`` because all of it is about fx graphs and the view pass (the
generic tensor checks do not need torch.fx), and apart from ``conformance/lowering/view_pass_cases.py`` so
that the catalogue holds case definitions only. No backend is imported here.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Interpreter, Node

from conformance.common.checks import bits, fail
from conformance.common.edge_form import is_view_op, view_twin, with_fake_values

__all__ = [
    "Observation",
    "as_laid_out",
    "assert_same_behaviour",
    "assert_truthful_meta",
    "differences",
    "downstream",
    "force_view_twins",
    "forcing_differences",
    "meta_mismatches",
    "observe",
    "outcome_problem",
    "report_contradictions",
    "report_mismatches",
    "stale_code",
    "unknowable_meta",
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


def as_laid_out(t: torch.Tensor) -> torch.Tensor:
    """A fresh copy of ``t`` laid out as ``t`` is: same shape, strides and storage offset, in a copy of its
    whole storage. ``Tensor.clone`` would make a sliced input dense and drop its offset, so a graph would
    run on another layout than the one its ``meta["val"]`` (and a pass) saw."""
    storage = t.untyped_storage().clone()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(
        storage, t.storage_offset(), t.shape, t.stride()
    )


def observe(module: Callable[..., Any], inputs: _Inputs) -> Observation:
    """Run ``module`` on fresh copies of ``inputs`` (each laid out as given, :func:`as_laid_out`); then write
    each output in turn to see what it shares."""
    fresh = [as_laid_out(t) for t in inputs]
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
    """What decides where each element lives and how it reads: the dtype, the shape, the strides of
    dimensions of size > 1 and the storage offset. A size-1 dimension is only ever indexed at 0, so its
    stride addresses nothing (torch itself calls ``(2, 1, 32)`` with strides ``(32, 8, 1)`` contiguous), and
    an empty tensor has no elements to place: reporting those would fail a pass for a layout no kernel can
    tell apart."""
    if t.numel() == 0:
        return t.dtype, tuple(t.shape)
    strides = tuple(s for s, n in zip(t.stride(), t.shape, strict=True) if n > 1)
    return t.dtype, tuple(t.shape), strides, t.storage_offset()


def _disagreement(name: str, fake: torch.Tensor, real: torch.Tensor) -> str:
    if fake.dtype != real.dtype:
        return f"{name}: meta dtype {fake.dtype}, real run {real.dtype}"
    meta = (tuple(fake.shape), fake.stride(), fake.storage_offset())
    run = (tuple(real.shape), real.stride(), real.storage_offset())
    return f"{name}: meta (shape, strides, offset) {meta}, real run {run}"


def _mismatches(module: GraphModule, inputs: _Inputs, names: Collection[str]) -> dict[str, str]:
    """Named node -> how its ``meta["val"]`` disagrees with a real run (nodes whose value holds no tensor,
    e.g. an in-place ``_foreach`` op's, have nothing to disagree about)."""
    recorder = _Recorder(module, set(names))
    recorder.run(*[as_laid_out(t) for t in inputs])
    nodes = _nodes(module)
    found: dict[str, str] = {}
    for name in sorted(names):
        real = [t for t in _flat(recorder.values.get(name)) if isinstance(t, torch.Tensor)]
        if not real:
            continue
        fake = nodes[name].meta.get("val")
        if fake is None:
            found[name] = f"{name} has no meta['val']"
            continue
        fakes = [t for t in _flat(fake) if isinstance(t, torch.Tensor)]
        if len(fakes) != len(real):
            found[name] = f"{name}: meta holds {len(fakes)} tensors, a real run {len(real)}"
            continue
        for fake_t, real_t in zip(fakes, real, strict=True):
            if _layout(fake_t) != _layout(real_t):
                found[name] = _disagreement(name, fake_t, real_t)
                break
    return found


def meta_mismatches(module: GraphModule, inputs: _Inputs, names: Collection[str]) -> list[str]:
    """Named nodes whose ``meta["val"]`` disagrees with a real run on what an element is and where it lives:
    dtype, shape, strides (of dimensions of size > 1) or storage offset."""
    return list(_mismatches(module, inputs, names).values())


def unknowable_meta(module: GraphModule, inputs: _Inputs, names: Collection[str]) -> set[str]:
    """Named nodes whose layout torch's own fake propagation of ``module`` gets wrong (a fake kernel that
    disagrees with the eager one): no pass can make their ``meta["val"]`` truthful, so none is judged on
    them. ``module`` is left as it is (a copy is propagated)."""
    honest = with_fake_values(copy.deepcopy(module), tuple(as_laid_out(t) for t in inputs))
    return set(_mismatches(honest, inputs, names))


def downstream(module: GraphModule, names: Collection[str]) -> set[str]:
    """``names`` and every node that uses one of them, directly or through other nodes (the output node
    aside): whose ``meta["val"]`` a rewrite of ``names`` can change."""
    nodes = _nodes(module)
    found: set[str] = set()
    todo = [nodes[name] for name in names if name in nodes]
    while todo:
        node = todo.pop()
        if node.name in found or node.op == "output":
            continue
        found.add(node.name)
        todo.extend(node.users)
    return found


# ============================================================================================ the report


def outcome_problem(outcome: object) -> str | None:
    """What keeps ``outcome`` from being the protocol's ``ViewPassOutcome`` (None: nothing): a
    ``GraphModule`` as ``graph_module``, node names (str) as ``rewritten``, a mapping of node name to reason
    (str) as ``refused``."""
    graph_module = getattr(outcome, "graph_module", None)
    if not isinstance(graph_module, GraphModule):
        return f"graph_module must be a GraphModule, got {graph_module!r}"
    rewritten, refused = getattr(outcome, "rewritten", None), getattr(outcome, "refused", None)
    if isinstance(rewritten, str) or not isinstance(rewritten, Sequence) or not isinstance(refused, Mapping):
        return (
            f"rewritten must be a list of node names and refused a mapping of reasons, got {rewritten!r} "
            f"and {refused!r}"
        )
    if not all(isinstance(name, str) for name in rewritten):
        return f"rewritten must hold node names (str), got {list(rewritten)!r}"
    if not all(isinstance(name, str) and isinstance(why, str) for name, why in refused.items()):
        return f"refused must map node names (str) to reasons (str), got {dict(refused)!r}"
    return None


def report_mismatches(original: GraphModule, result: GraphModule, rewritten: Collection[str]) -> list[str]:
    """Where ``rewritten`` disagrees with the copies of ``original`` that are views in ``result``
    (:func:`views_in_result`): a listed node that is no view there, a view that is not listed."""
    views, after, found = views_in_result(original, result), _nodes(result), []
    for name in sorted(set(rewritten) - views):
        now = after[name].target if name in after else "missing"
        found.append(f"rewritten lists {name}, but the result has {now}, not a view")
    for name in sorted(views - set(rewritten)):
        found.append(f"{name} became {after[name].target} but is not listed in rewritten")
    return found


def report_contradictions(outcome: Any) -> list[str]:
    """Where a pass's report cannot describe the graph it returns, whatever that graph is: a node listed as
    both rewritten and refused (or unmapped), or a node it names that the result does not have. Reads
    ``rewritten``, ``refused`` and the optional ``unmapped`` of a protocol-shaped ``outcome``."""
    lists = {
        "rewritten": list(outcome.rewritten),
        "refused": list(outcome.refused),
        "unmapped": list(getattr(outcome, "unmapped", None) or ()),
    }
    found = []
    for first, second in (("rewritten", "refused"), ("rewritten", "unmapped"), ("refused", "unmapped")):
        both = sorted(set(lists[first]) & set(lists[second]))
        if both:
            found.append(f"{', '.join(both)} listed both as {first} and as {second}")
    after = _nodes(outcome.graph_module)
    for kind, names in lists.items():
        missing = sorted(set(names) - set(after))
        if missing:
            found.append(f"{kind} names {', '.join(missing)}, which the result graph does not have")
    return found


def stale_code(module: GraphModule) -> str | None:
    """How ``module``'s code (what ``module(...)`` runs) differs from the code of its graph (what a compiler
    lowers), or None when they agree: a pass that edits the graph must ``recompile()``."""
    expected = module.graph.python_code(root_module="self").src
    if module.code == expected:
        return None
    diff = difflib.unified_diff(
        module.code.strip().splitlines(),
        expected.strip().splitlines(),
        "module.code",
        "its graph",
        n=0,
        lineterm="",
    )
    changed = [
        f"{line[0]} {line[1:].strip()}"
        for line in diff
        if line[:1] in "+-" and line[:3] not in ("+++", "---")
    ]
    return "; ".join(changed[:6]) or "the code differs from its graph's in whitespace only"


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
