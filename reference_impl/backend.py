"""The reference backend as the suite sees it: one object implementing the plug-in protocol."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch.fx import GraphModule

__version__ = "0.1.0"


@dataclass(frozen=True)
class ViewPassOutcome:
    """What the protocol's ``view_copy_pass`` returns: the result and the pass's verdicts."""

    graph_module: GraphModule
    rewritten: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


class ReferenceBackend:
    """Implements the protocol of ``conformance/protocol.py`` by delegating to the reference parts."""

    name = "reference_impl"
    version = __version__

    def mm_out(self, out: torch.Tensor, self_: torch.Tensor, mat2: torch.Tensor, /) -> None:
        # Imported on first use so that loading the backend never loads cuBLAS.
        from reference_impl.shims.mm_out import mm_out

        mm_out(out, self_, mat2)


    def view_copy_pass(self, graph_module: GraphModule) -> ViewPassOutcome:
        from reference_impl.lowering.view_copy_pass import run_view_copy_pass

        result, report = run_view_copy_pass(graph_module)
        return ViewPassOutcome(
            graph_module=result,
            rewritten=[r.node for r in report.rewrites],
            refused={r.node: str(r.reason.value) for r in report.refusals},
        )


BACKEND = ReferenceBackend()
