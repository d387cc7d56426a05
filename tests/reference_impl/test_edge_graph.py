"""The edge-like graph keeps the exported program's dynamic shapes (a regression: it specialised them)."""

from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import free_symbols

from conformance.models import get_model
from reference_impl.lowering import to_edge_graph


def test_dynamic_token_length_survives_view_functionalization() -> None:
    model = get_model("asr")
    module, inputs = model.build(torch.float32, torch.device("cpu"))["decoder"]
    edge = to_edge_graph(module, inputs, dynamic_shapes=model.dynamic_shapes_for("decoder"))
    tokens = next(n for n in edge.graph.nodes if n.op == "placeholder" and n.name == "tokens")
    length = tokens.meta["val"].shape[1]
    assert free_symbols(length), f"token length was specialised to {length}"
    assert any(n.target == torch.ops.aten.slice_copy.Tensor for n in edge.graph.nodes)


def test_view_pass_copy_keeps_signature_and_graph_names_in_step() -> None:
    """nn.Linear's placeholder is named ``input``; copying the graph renames it, the signature must follow."""
    from reference_impl.lowering.trivial import trivial_linear
    from reference_impl.lowering.view_copy_pass import run_view_copy_pass

    module, inputs = trivial_linear("cpu")
    result, _ = run_view_copy_pass(to_edge_graph(module, inputs))
    placeholders = [n.name for n in result.graph.nodes if n.op == "placeholder"]
    assert [spec.arg.name for spec in result.graph_signature.input_specs] == placeholders
    assert torch.equal(result.module()(*inputs), module(*inputs))


def test_copies_the_pass_keeps_become_view_plus_clone() -> None:
    """A kept select_copy (no AOTInductor C shim) becomes select + clone: same values, no copy op left."""
    from reference_impl.lowering.edge import COPY_TO_VIEW, materialize_remaining_copies

    class TwoHeads(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.select(1, 0).unsqueeze(0) + x.select(1, 1)

    x = torch.randn(4, 3, 5)
    edge = to_edge_graph(TwoHeads(), (x,))
    assert any(n.target == torch.ops.aten.select_copy.int for n in edge.graph.nodes)
    expected = edge.module()(x)
    assert materialize_remaining_copies(edge.graph_module) > 0
    assert not any(n.target in COPY_TO_VIEW for n in edge.graph.nodes)
    assert torch.equal(edge.module()(x), expected)
