"""Partitioner: mark what the AOTInductor backend takes over (ExecuTorch's ``CudaPartitioner`` behaviour).

The whole method goes to one delegate: every delegable ``call_function`` node of the top-level graph gets one
delegation tag in ``node.meta["delegation_tag"]``, and so does every constant placeholder (parameter, buffer,
lifted tensor constant) whose users all carry that tag — upstream's ``tag_constant_data`` and
``tag_mutated_buffer`` — so the delegate owns its weights. User inputs are never tagged.

``partition`` tags in place and returns the tags with their delegation spec (backend id and compile specs, the
``method_name`` spec included when a name is given), plus which nodes were tagged and which were not.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import torch
from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket
from torch.fx import Node

from reference_impl.format.compile_spec import CompileSpec, find_method_name, method_name_spec

__all__ = [
    "BACKEND_ID",
    "DEFAULT_TAG",
    "TAG_KEY",
    "DelegationSpec",
    "PartitionResult",
    "constant_placeholders",
    "is_delegable",
    "partition",
    "tags_of",
]

TAG_KEY = "delegation_tag"
DEFAULT_TAG = "aoti_reference_0"
BACKEND_ID = "AotiReferenceBackend"

# Symbolic-shape arithmetic that export leaves as plain Python callables (dynamic shapes).
_SYMBOLIC_MODULES = frozenset({"_operator", "operator", "math"})
_SYMBOLIC_TORCH = frozenset(
    getattr(torch, name)
    for name in ("sym_int", "sym_float", "sym_max", "sym_min", "sym_not", "sym_ite", "sym_sqrt", "sym_sum")
    if hasattr(torch, name)
)


@dataclass(frozen=True)
class DelegationSpec:
    """Which backend takes a tagged partition, and the compile specs it gets."""

    backend_id: str
    compile_specs: tuple[CompileSpec, ...] = ()


@dataclass(frozen=True)
class PartitionResult:
    """The (tagged in place) program, its tags, and the names of tagged and untagged nodes."""

    program: torch.export.ExportedProgram = field(repr=False)
    partition_tags: Mapping[str, DelegationSpec]
    tagged_nodes: tuple[str, ...]
    tagged_constants: tuple[str, ...]
    untagged_nodes: tuple[str, ...]  # call_function nodes the predicate refused

    @property
    def fully_delegated(self) -> bool:
        return not self.untagged_nodes


def is_delegable(node: Node) -> bool:
    """Default predicate: ATen / prims / any registered op, higher-order ops, and symbolic-shape arithmetic.

    Arbitrary Python callables left in a graph are not delegable: AOTInductor cannot compile them.
    """
    if node.op != "call_function":
        return False
    target = node.target
    if isinstance(target, (OpOverload, OpOverloadPacket, HigherOrderOperator)):
        return True
    if target in _SYMBOLIC_TORCH:
        return True
    return callable(target) and getattr(target, "__module__", None) in _SYMBOLIC_MODULES


def constant_placeholders(program: torch.export.ExportedProgram) -> dict[str, str]:
    """Placeholder name → kind ("parameter" | "buffer" | "constant") for the program's constant inputs."""
    signature = program.graph_signature
    kinds: dict[str, str] = {}
    for name in signature.inputs_to_parameters:
        kinds[name] = "parameter"
    for name in signature.inputs_to_buffers:
        kinds[name] = "buffer"
    for name in getattr(signature, "inputs_to_lifted_tensor_constants", {}):
        kinds[name] = "constant"
    return kinds


def partition(
    program: torch.export.ExportedProgram,
    *,
    method_name: str | None = None,
    compile_specs: Sequence[CompileSpec] = (),
    tag: str = DEFAULT_TAG,
    delegable: Callable[[Node], bool] = is_delegable,
    backend_id: str = BACKEND_ID,
) -> PartitionResult:
    """Tag every delegable call_function node, and the constants only tagged nodes use, with ``tag``."""
    if not isinstance(tag, str) or not tag:
        raise ValueError(f"delegation tag must be a non-empty str, got {tag!r}")
    specs = tuple(compile_specs)
    spec_name = find_method_name(specs)
    if method_name is not None:
        if spec_name is None:
            specs = (method_name_spec(method_name), *specs)
        elif spec_name != method_name:
            raise ValueError(
                f"method_name {method_name!r} disagrees with the 'method_name' compile spec {spec_name!r}"
            )

    graph = program.graph_module.graph
    tagged: list[str] = []
    untagged: list[str] = []
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        node.meta.pop(TAG_KEY, None)  # re-partitioning starts clean
        if delegable(node):
            node.meta[TAG_KEY] = tag
            tagged.append(node.name)
        else:
            untagged.append(node.name)

    constants = constant_placeholders(program)
    tagged_constants: list[str] = []
    for node in graph.nodes:
        if node.op != "placeholder" or node.name not in constants:
            continue
        node.meta.pop(TAG_KEY, None)
        users = list(node.users)
        # A constant belongs to the delegate when every user does (an unused constant goes along too).
        if all(user.meta.get(TAG_KEY) == tag for user in users) and (users or tagged):
            node.meta[TAG_KEY] = tag
            tagged_constants.append(node.name)

    tags = MappingProxyType({tag: DelegationSpec(backend_id, specs)} if tagged else {})
    return PartitionResult(program, tags, tuple(tagged), tuple(tagged_constants), tuple(untagged))


def tags_of(program: torch.export.ExportedProgram) -> dict[str, str]:
    """Node name → delegation tag, for every tagged node of the top-level graph."""
    return {
        node.name: node.meta[TAG_KEY] for node in program.graph_module.graph.nodes if TAG_KEY in node.meta
    }
