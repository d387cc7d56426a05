"""Lowering: edge-like graphs and the passes that run on them before AOTInductor compiles a method."""

from reference_impl.lowering.edge import COPY_TO_VIEW, VIEW_TO_COPY, to_edge_graph
from reference_impl.lowering.view_copy_pass import (
    Reason,
    Refusal,
    ReplaceViewCopyWithViewPass,
    Rewrite,
    ViewPassReport,
    run_view_copy_pass,
)

__all__ = [
    "COPY_TO_VIEW",
    "VIEW_TO_COPY",
    "Reason",
    "Refusal",
    "ReplaceViewCopyWithViewPass",
    "Rewrite",
    "ViewPassReport",
    "run_view_copy_pass",
    "to_edge_graph",
]
