"""The upstream ExecuTorch adapter (``upstream_executorch:BACKEND``): identity, the view pass verdicts it
derives from upstream's graphs, and lowering's argument checks (lowering itself needs CUDA and Triton).

Skipped, with the reason, where executorch or its AOT dependencies are not installed.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from upstream_executorch import backend as adapter

try:
    VERSION = adapter.require_executorch()
    from executorch.backends.aoti.passes import replace_view_copy_with_view  # noqa: F401
except ImportError as exc:
    pytest.skip(f"upstream ExecuTorch is not importable here: {exc}", allow_module_level=True)

import torch
from torch import nn
from torch.fx import Graph, GraphModule, Node

import upstream_executorch
from conformance.protocol import lower_options, lowering_devices, missing_attributes
from harness.backend_loader import BackendLoadError, load_backend

aten = torch.ops.aten
ROOT = Path(__file__).resolve().parents[2]
SPEC = "upstream_executorch:BACKEND"


# ================================================================================================ identity


def test_backend_identity_and_parts() -> None:
    backend = load_backend(SPEC)
    assert backend is upstream_executorch.BACKEND
    assert backend.name == "executorch"
    assert backend.version == importlib.metadata.version("executorch") == VERSION
    assert missing_attributes(backend, "view_pass") == []
    assert missing_attributes(backend, "lowering") == []
    assert missing_attributes(backend, "device_placement") == []
    # No runtime part: the wheel cannot run CudaBackend programs, and the adapter must not pretend it can.
    assert missing_attributes(backend, "runtime") == ["init", "execute", "destroy", "execute_stats"]
    assert lowering_devices(backend) == ("cuda",)
    assert lower_options(backend) == {adapter.SKIP_H2D, adapter.SKIP_D2H}


def test_importing_the_package_imports_neither_executorch_nor_torch() -> None:
    code = "import sys, upstream_executorch; print(sorted({'executorch', 'torch'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_missing_executorch_is_a_clear_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real_version = importlib.metadata.version

    def version(name: str) -> str:
        if name == "executorch":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setattr(upstream_executorch, "_backend", None)
    with pytest.raises(ImportError, match=r"missing: executorch\. .*pip install \.\[executorch\]"):
        _ = upstream_executorch.BACKEND
    # What the suite's loader makes of it (it wraps only an import of the module itself today).
    with pytest.raises((ImportError, BackendLoadError), match=r"pip install \.\[executorch\]"):
        load_backend(SPEC)


def test_upstream_table_has_aten_and_edge_overloads() -> None:
    table = adapter.upstream_view_targets()
    assert table[aten.slice_copy.Tensor] is aten.slice.Tensor
    assert table[aten.select_copy.int] is aten.select.int
    assert any(type(op).__name__ == "EdgeOpOverload" for op in table)


# =============================================================================================== view pass


def _graph(build: Callable[[Graph, Node], Any]) -> GraphModule:
    graph = Graph()
    x = graph.placeholder("x")
    graph.output(build(graph, x))
    return GraphModule(nn.Module(), graph)


def _targets(module: GraphModule) -> dict[str, object]:
    return {n.name: n.target for n in module.graph.nodes if n.op == "call_function"}


def test_slice_copy_is_rewritten_and_the_result_runs() -> None:
    original = _graph(lambda g, x: g.call_function(aten.slice_copy.Tensor, (x, 1, 0, 2)))
    name = next(iter(_targets(original)))
    outcome = upstream_executorch.BACKEND.view_copy_pass(original)
    assert outcome.rewritten == [name]
    assert outcome.refused == {}
    assert outcome.unmapped == {}
    assert _targets(outcome.graph_module)[name] is aten.slice.Tensor
    assert _targets(original)[name] is aten.slice_copy.Tensor, "the caller's graph must stay as it was"
    x = torch.arange(12.0).reshape(3, 4)
    assert torch.equal(outcome.graph_module(x), original(x))


def test_permute_copy_is_reported_unmapped_not_refused() -> None:
    original = _graph(lambda g, x: g.call_function(aten.permute_copy.default, (x, [1, 0])))
    name = next(iter(_targets(original)))
    outcome = upstream_executorch.BACKEND.view_copy_pass(original)
    assert outcome.rewritten == []
    assert outcome.refused == {}
    assert outcome.unmapped == {name: "aten.permute_copy.default"}
    assert _targets(outcome.graph_module)[name] is aten.permute_copy.default


def test_slice_copy_with_an_in_place_user_is_refused() -> None:
    def build(g: Graph, x: Node) -> Node:
        s = g.call_function(aten.slice_copy.Tensor, (x, 0, 0, 2))
        return g.call_function(aten.add_.Tensor, (s, 1.0))

    original = _graph(build)
    name = next(n for n, t in _targets(original).items() if t is aten.slice_copy.Tensor)
    outcome = upstream_executorch.BACKEND.view_copy_pass(original)
    assert outcome.rewritten == []
    assert outcome.refused == {name: adapter.KEPT_REASON}
    x = torch.zeros(3, 4)
    outcome.graph_module(x)
    assert torch.equal(x, torch.zeros(3, 4)), "the copy must still protect the input"


def test_select_copy_with_a_view_user_is_refused_and_other_copies_judged_alone() -> None:
    def build(g: Graph, x: Node) -> tuple[Node, Node]:
        c = g.call_function(aten.select_copy.int, (x, 0, 1))
        v = g.call_function(aten.view.default, (c, [2, 2]))
        return v, g.call_function(aten.select_copy.int, (x, 0, 2))

    original = _graph(build)
    first, second = (n for n, t in _targets(original).items() if t is aten.select_copy.int)
    outcome = upstream_executorch.BACKEND.view_copy_pass(original)
    assert outcome.refused == {first: adapter.KEPT_REASON}
    assert outcome.rewritten == [second]


# ================================================================================================ lowering


class _Tiny(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


METHODS = {"encoder": (_Tiny(), (torch.ones(2),)), "decoder": (_Tiny(), (torch.ones(2),), None)}


@pytest.fixture
def reached(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """Stands in for upstream's lowering (CUDA and Triton only) and records the options it was given."""
    calls: list[dict[str, object]] = []

    def fake(methods: Any, options: dict[str, object]) -> adapter.LoweredProgram:
        calls.append(dict(options))
        return adapter.LoweredProgram(b"pte", {}, tuple(methods), {})

    monkeypatch.setattr(adapter, "lower_with_upstream", fake)
    return calls


@pytest.mark.parametrize(
    ("options", "device", "words"),
    [
        ({"view_pass": False}, "cuda", "option 'view_pass' is not supported .*no switch"),
        (["skip"], "cuda", "argument 'options' must be a mapping"),
        (None, "cpu", "argument 'device' is 'cpu'.*only for cuda"),
    ],
)
def test_lower_rejects_bad_arguments_before_compiling(
    reached: list[Any], options: Any, device: str, words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        upstream_executorch.BACKEND.lower(METHODS, device=device, options=options)
    assert reached == [], "nothing may be exported or compiled before the arguments are checked"


def test_lower_rejects_bad_methods(reached: list[Any]) -> None:
    with pytest.raises(ValueError, match="argument 'methods' must be a non-empty mapping"):
        upstream_executorch.BACKEND.lower({}, device="cuda")
    with pytest.raises(ValueError, match="method 'm' must be"):
        upstream_executorch.BACKEND.lower({"m": _Tiny()}, device="cuda")
    assert reached == []


@pytest.mark.parametrize(
    "options",
    [{adapter.SKIP_H2D: "yes"}, {adapter.SKIP_D2H: {"prefill": True}}, {adapter.SKIP_D2H: {"encoder": 1}}],
    ids=["str", "unknown-method", "int"],
)
def test_placement_values_go_to_upstream_unjudged(reached: list[Any], options: dict[str, object]) -> None:
    """Whether upstream rejects a bad placement is upstream's behaviour for the suite to see, not ours."""
    assert upstream_executorch.BACKEND.lower(METHODS, device="cuda", options=options) == b"pte"
    assert reached == [options]


def test_backend_config_maps_placement_onto_upstream() -> None:
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes.propagate_device_config import PropagateDeviceConfig

    plain = adapter._backend_config({}, ["a"])
    assert plain.propagate_device_config == ExecutorchBackendConfig().propagate_device_config
    options = {adapter.SKIP_H2D: {"a": True}, adapter.SKIP_D2H: {"b": True, "typo": True}}
    config = adapter._backend_config(options, ["a", "b"])
    assert config.enable_non_cpu_memory_planning is True
    assert config.propagate_device_config == {
        "a": PropagateDeviceConfig(skip_h2d_for_method_inputs=True, skip_d2h_for_method_outputs=False),
        "b": PropagateDeviceConfig(skip_h2d_for_method_inputs=False, skip_d2h_for_method_outputs=True),
        "typo": PropagateDeviceConfig(skip_h2d_for_method_inputs=False, skip_d2h_for_method_outputs=True),
    }
    planning = config.memory_planning_pass
    assert (planning["a"].alloc_graph_input, planning["a"].alloc_graph_output) == (False, True)
    assert (planning["b"].alloc_graph_input, planning["b"].alloc_graph_output) == (True, False)
    every = adapter._backend_config({adapter.SKIP_H2D: True}, ["a", "b"]).propagate_device_config
    assert all(c.skip_h2d_for_method_inputs is True for c in every.values())
