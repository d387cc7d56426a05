"""Broken backends for the runtime options (``runtime_options/*``) and the view pass's remaining rules
(``lowering/*``): each wraps the reference and slips one way a real backend does, and declares (``breaks``)
the rules its chapter must fail it on. ``tests/conformance/test_broken_chapter_backends.py`` runs each one.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch.fx import GraphModule
from torch.fx.passes.infra.pass_base import PassResult

from reference_impl import BACKEND as REFERENCE
from reference_impl.lowering import COPY_TO_VIEW
from tests.broken.basic import NaiveViewPassOutcome, _fake, _repropagate
from tests.broken.chapter import LOWERING, RUNTIME_OPTIONS, Forwarding
from tests.rule_coverage import Breaks

SKIP = "skip_copy_output_to_cpu_for_method"


def _tokens(value: str) -> list[str]:
    return [t.strip() for t in value.split(",") if t.strip()]


# ============================================================================================== options


class ValidatesMethodNames(Forwarding):
    """Rejects, "helpfully", a skip-copy value naming a method no loaded program has: before the first
    ``init`` no method is known, so every non-empty list is refused (breaks before-init and list-values:
    the option is backend-wide and must accept any list at any time)."""

    def __init__(self, name: str, breaks: Breaks) -> None:
        super().__init__(name, breaks)
        self._methods: set[str] = set()

    def init(self, program: bytes, method: str) -> object:
        handle = REFERENCE.init(program, method)
        self._methods.add(method)
        return handle

    def set_option(self, key: str, value: object) -> None:
        if key == SKIP and isinstance(value, str):
            unknown = sorted(set(_tokens(value)) - self._methods)
            if unknown:
                raise ValueError(f"{key!r}: unknown method(s) {unknown}; loaded: {sorted(self._methods)}")
        REFERENCE.set_option(key, value)


class StoresBeforeApplying(Forwarding):
    """Keeps its own option table: ``set_option`` writes the table first, then hands the known key to the
    runtime, which validates it. Other keys are never looked at (non-string or over-long keys are stored
    silently), and a value the runtime rejects stays in the table that ``get_option`` reads (the call fails,
    yet the option changed: all-or-nothing broken)."""

    def __init__(self, name: str, breaks: Breaks) -> None:
        super().__init__(name, breaks)
        self._table: dict[Any, object] = {}

    def set_option(self, key: Any, value: object) -> None:
        self._table[key] = value
        if key == SKIP:
            REFERENCE.set_option(key, value)

    def get_option(self, key: str) -> object:
        return self._table[key] if key in self._table else REFERENCE.get_option(key)


class KeepsParsedList(Forwarding):
    """Holds the option parsed, as the list of method names it selects: ``set_option`` also takes a ready
    list "for convenience" (breaks non-string-value) and ``get_option`` returns that list, not the string
    (breaks round-trip)."""

    def __init__(self, name: str, breaks: Breaks) -> None:
        super().__init__(name, breaks)
        self._methods: list[str] = []

    def set_option(self, key: str, value: object) -> None:
        if key == SKIP and isinstance(value, (list, tuple)):
            value = ",".join(value)
        REFERENCE.set_option(key, value)
        if key == SKIP:
            self._methods = _tokens(value)  # type: ignore[arg-type]

    def get_option(self, key: str) -> object:
        REFERENCE.get_option(key)  # the reference's key checks
        return list(self._methods) if key == SKIP else REFERENCE.get_option(key)


class FrozenAfterInit(Forwarding):
    """Reads the options once per handle at ``init`` and so refuses to change them while a handle is alive
    (breaks after-init: the option must be settable with live handles)."""

    def __init__(self, name: str, breaks: Breaks) -> None:
        super().__init__(name, breaks)
        self._live: set[int] = set()

    def init(self, program: bytes, method: str) -> object:
        handle = REFERENCE.init(program, method)
        self._live.add(id(handle))
        return handle

    def destroy(self, handle: object) -> None:
        self._live.discard(id(handle))
        REFERENCE.destroy(handle)

    def set_option(self, key: str, value: object) -> None:
        if self._live:
            raise RuntimeError(f"options cannot change while {len(self._live)} handle(s) are alive")
        REFERENCE.set_option(key, value)


#: Every method of the suite's multi-method programs.
_ALL_METHODS = "encoder,decoder,prefill,decode"


class KeepsEverythingByDefault(Forwarding):
    """Thinks device outputs are the sensible default: until the option is first set, it names every
    method (breaks default: never set, the option must name none, so outputs are copied to the host)."""

    def __init__(self, name: str, breaks: Breaks) -> None:
        super().__init__(name, breaks)
        self._set = False

    def _default(self) -> None:
        if not self._set:  # lazily: importing this module must not touch the reference's options
            self._set = True
            REFERENCE.set_option(SKIP, _ALL_METHODS)

    def set_option(self, key: str, value: object) -> None:
        self._default()
        REFERENCE.set_option(key, value)

    def get_option(self, key: str) -> object:
        self._default()
        return REFERENCE.get_option(key)

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        self._default()
        return REFERENCE.execute(handle, inputs, outputs)


# ============================================================================================ view pass

#: The reference's refusals that look at one node only (its users, the base's layout).
_PER_NODE_REASONS = ("call-method-user", "written-by-user", "view-user", "not-viewable")


class SkipsPerNodeChecks(Forwarding):
    """The reference pass with its per-node checks dropped: it still refuses what its graph-wide analysis
    finds (source writes, outputs, containers), but any copy refused for its users or its base's layout
    becomes a view anyway, its ``meta["val"]`` refreshed where the view can be built."""

    def view_copy_pass(self, graph_module: GraphModule) -> NaiveViewPassOutcome:
        reference = REFERENCE.view_copy_pass(graph_module)
        module = reference.graph_module
        outcome = NaiveViewPassOutcome(module, list(reference.rewritten), dict(reference.refused))
        for node in module.graph.nodes:
            if outcome.refused.get(node.name) not in _PER_NODE_REASONS:
                continue
            view = COPY_TO_VIEW[node.target]
            node.target = view
            with contextlib.suppress(Exception):  # a view the base's strides forbid: the copy's value stays
                node.meta["val"] = view(*_fake(node.args), **_fake(node.kwargs))
            outcome.rewritten.append(node.name)
            del outcome.refused[node.name]
        module.graph.lint()
        module.recompile()
        _repropagate(module)
        return outcome


class ReportsRefusedAsRewritten(Forwarding):
    """Lists every copy it looked at in ``rewritten``, the refused ones too (they stay in ``refused``): the
    graph is the reference's, the report is not (breaks report)."""

    def view_copy_pass(self, graph_module: GraphModule) -> NaiveViewPassOutcome:
        reference = REFERENCE.view_copy_pass(graph_module)
        listed = [*reference.rewritten, *reference.refused]
        return NaiveViewPassOutcome(reference.graph_module, listed, dict(reference.refused))


class ReturnsPassResult(Forwarding):
    """Returns torch.fx's ``PassResult(graph_module, modified)``, as an fx pass's ``call`` does, instead of
    the protocol's outcome (no ``rewritten``, no ``refused``: breaks outcome)."""

    def view_copy_pass(self, graph_module: GraphModule) -> PassResult:
        reference = REFERENCE.view_copy_pass(copy.deepcopy(graph_module))
        return PassResult(reference.graph_module, bool(reference.rewritten))


# ============================================================================================ instances

VALIDATES_METHOD_NAMES = ValidatesMethodNames(
    "validates-method-names",
    Breaks(
        ("runtime_options/before-init", "runtime_options/list-values"),
        RUNTIME_OPTIONS,
        ("-k", "options_before_init or list_values_are_accepted"),
    ),
)
STORES_BEFORE_APPLYING = StoresBeforeApplying(
    "stores-before-applying",
    Breaks(
        ("runtime_options/non-string-key", "runtime_options/key-length", "runtime_options/all-or-nothing"),
        RUNTIME_OPTIONS,
        ("-k", "non_string or key_over_63"),
    ),
)
KEEPS_PARSED_LIST = KeepsParsedList(
    "keeps-parsed-list",
    Breaks(
        ("runtime_options/non-string-value", "runtime_options/round-trip"),
        RUNTIME_OPTIONS,
        ("-k", "options_before_init or (non_string_value and list)"),
    ),
)
FROZEN_AFTER_INIT = FrozenAfterInit(
    "frozen-after-init",
    Breaks(("runtime_options/after-init",), RUNTIME_OPTIONS, ("-k", "options_with_live_handles and cpu")),
)
KEEPS_EVERYTHING_BY_DEFAULT = KeepsEverythingByDefault(
    "keeps-everything-by-default",
    Breaks(
        ("runtime_options/default",), RUNTIME_OPTIONS, ("-k", "skip_copy_matrix_cpu_target and llm-unset")
    ),
)
SKIPS_PER_NODE_CHECKS = SkipsPerNodeChecks(
    "skips-per-node-checks",
    Breaks(
        (
            "lowering/call-method-user",
            "lowering/written-by-user",
            "lowering/view-user",
            "lowering/not-viewable",
            "lowering/call-method-user/policy",
            "lowering/view-user/policy",
            "lowering/written-by-user/policy",
        ),
        LOWERING,
        ("-k", "view_pass and (call-method-user or written-by-user or view-user or not-viewable)"),
        strict_should=True,
    ),
)
REPORTS_REFUSED_AS_REWRITTEN = ReportsRefusedAsRewritten(
    "reports-refused-as-rewritten",
    Breaks(
        ("lowering/report",), LOWERING, ("-k", "view_pass_verdicts and source-mutated"), strict_should=True
    ),
)
RETURNS_PASS_RESULT = ReturnsPassResult(
    "returns-pass-result",
    Breaks(("lowering/outcome",), LOWERING, ("-k", "view_pass_verdicts and every-view-twin")),
)
