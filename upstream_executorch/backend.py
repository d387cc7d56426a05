"""The adapter: upstream ExecuTorch's own AOT code behind the protocol of ``conformance/protocol.py``.

Parts implemented, each by calling upstream unchanged (never a copy of its code):

``view_pass``
    ``executorch.backends.aoti.passes.replace_view_copy_with_view.ReplaceViewCopyWithViewPass`` on a deep
    copy of the graph. Upstream reports only ``PassResult.modified``, so the verdicts are read off the graph
    before and after: a node whose op is in upstream's table ``_VIEW_TARGETS`` and was retargeted to its
    entry is *rewritten*; one in the table that kept its op is *refused* (upstream's only reason to keep
    a mapped copy is a blocking user). Copies of view ops missing from the table are neither: they are
    upstream's op coverage, reported in ``ViewPassOutcome.unmapped``.

``lowering`` (target ``cuda`` only)
    Upstream's own path, as ``examples/cuda/scripts/export.py`` and ``examples/models/gemma4_31b/export.py``
    take it: ``torch.export`` per method → ``to_edge_transform_and_lower`` with one ``CudaPartitioner`` per
    method (carrying ``CudaBackend.generate_method_name_compile_spec(name)``) and
    ``EdgeCompileConfig(_check_ir_validity=False)`` → ``to_executorch(ExecutorchBackendConfig(...))``.
    The export-time device placement keys map to upstream's ``PropagateDeviceConfig`` with
    ``enable_non_cpu_memory_planning=True`` and a ``MemoryPlanningPass`` that does not allocate the
    skipped inputs/outputs (as ``PropagateDeviceConfig``'s docstring prescribes). Their values are handed
    over as given, not validated here: whether a misspelt method name or a non-bool flag is rejected is
    upstream's behaviour, and the suite's ``device_placement/validation`` cases report it. There is no
    ``view_pass`` option: ``AotiBackend.preprocess`` always runs the pass and has no switch for it.

Not implemented: part ``runtime``. The PyPI wheel (``executorch==1.5.1``) is a CPU build. Its Python runtime,
``executorch.extension.pybindings.portable_lib`` (the LLM runner and training bindings link the same
libraries), registers the delegates
``XnnpackBackend``, ``QnnBackend`` and ``OpenvinoBackend`` (``_get_registered_backend_names()``), and the
wheel's native libraries (``lib/libexecutorch*.so``, ``extension/pybindings/_C*.so``) contain no
``CudaBackend``, no AOTI CUDA shims and link no CUDA library. A program whose methods are delegated to
``CudaBackend`` therefore cannot be loaded by anything in the wheel: ``_load_for_executorch_from_buffer``
on such a program logs "Backend CudaBackend is not registered" and raises ``RuntimeError`` (error 0x20,
NotFound; checked with a stand-in delegate of that id on the CPU). Upstream's own
``extension/pybindings/test/test_pybindings.py`` skips its CUDA cases with "needs a build with the CUDA
backend linked in". Running one needs upstream's C++ runtime built from source with
``EXECUTORCH_BUILD_CUDA=ON``. The adapter says so instead of faking ``init``/``execute``.
"""

from __future__ import annotations

import copy
import importlib.metadata
import importlib.util
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.fx import GraphModule

#: The upstream version this adapter was written and checked against (pyproject's ``executorch`` extra).
PINNED_VERSION = "1.5.1"
#: What upstream's AOT import path needs besides torch and numpy: module → distribution. Found by hiding
#: each of executorch's declared dependencies in turn and importing exir, the AOTI pass and partitioner.
AOT_DEPENDENCIES = {"ruamel.yaml": "ruamel.yaml", "flatbuffers": "flatbuffers", "tabulate": "tabulate"}
INSTALL_HINT = (
    "install them with `pip install .[executorch]` from the repository root (that also pulls executorch's "
    "own long dependency list), or just the AOT path: `pip install --no-deps executorch==1.5.1 ruamel.yaml "
    "flatbuffers tabulate`"
)

SKIP_H2D = "skip_h2d_for_method_inputs"
SKIP_D2H = "skip_d2h_for_method_outputs"
#: The reason given for a mapped copy that upstream left alone: its pass skips a node only for a user that
#: writes it (in-place, ``out=``, a ``call_method`` ending in ``_``) or is a view op or a ``call_method``.
KEPT_REASON = "upstream kept the copy (a blocking user)"


def require_executorch() -> str:
    """The installed executorch version, or an ``ImportError`` naming what is missing and how to get it."""
    missing: list[str] = []
    version = ""
    try:
        version = importlib.metadata.version("executorch")
    except importlib.metadata.PackageNotFoundError:
        missing.append("executorch")
    for module, distribution in AOT_DEPENDENCIES.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # the parent package (``ruamel``) is missing too
            found = False
        if not found:
            missing.append(distribution)
    if missing:
        raise ImportError(
            f"upstream_executorch:BACKEND needs executorch=={PINNED_VERSION} and the packages its AOT path "
            f"imports; missing: {', '.join(missing)}. To {INSTALL_HINT}.",
            name=missing[0],
        )
    return version


@dataclass(frozen=True)
class ViewPassOutcome:
    """What ``view_copy_pass`` returns: the protocol's three fields, plus upstream's op coverage."""

    graph_module: GraphModule
    rewritten: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    #: Copies of view ops (``permute_copy``, ``view_copy``, ...) that upstream's table does not map: node
    #: name → op (``aten.permute_copy.default``). Not a verdict on the node, a gap in upstream's coverage.
    unmapped: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LoweredProgram:
    """Everything ``to_executorch`` produced for one ``lower`` call, and what each stage took."""

    pte: bytes
    #: External named data (``CudaBackend.save_data_externally()`` is True: the AOTI weights go to
    #: ``aoti_cuda_blob.ptd``, which upstream's runtime takes with ``--data_path``): file name → bytes.
    data_files: dict[str, bytes]
    methods: tuple[str, ...]
    seconds: dict[str, float]


def view_copy_name(target: object) -> str | None:
    """``aten.permute_copy.default`` for a functional copy of a view op (its ``_copy``-less twin has a view
    schema, ``Tensor(a) -> Tensor(a)``), else None. Edge ops are judged by the ATen op they wrap."""
    import torch

    # An edge op wraps its ATen overload in ``_op`` (an OpOverload's own ``_op`` is the C++ builtin).
    op = target if isinstance(target, torch._ops.OpOverload) else getattr(target, "_op", None)
    if not isinstance(op, torch._ops.OpOverload) or not op._opname.endswith("_copy"):
        return None
    packet = getattr(getattr(torch.ops, op.namespace), op._opname.removesuffix("_copy"), None)
    twin = getattr(packet, op._overloadname, None) if packet is not None else None
    return str(op) if twin is not None and getattr(twin, "is_view", False) else None


def upstream_view_targets() -> dict[Any, Any]:
    """Upstream's mapping table (copy op → view op), read from its module at call time."""
    from executorch.backends.aoti.passes import replace_view_copy_with_view

    return dict(replace_view_copy_with_view._VIEW_TARGETS)


def _call_functions(graph_module: GraphModule) -> dict[str, object]:
    return {n.name: n.target for n in graph_module.graph.nodes if n.op == "call_function"}


def run_upstream_view_pass(graph_module: GraphModule) -> ViewPassOutcome:
    """Upstream's ``ReplaceViewCopyWithViewPass`` on a deep copy, with verdicts derived from the graphs."""
    from executorch.backends.aoti.passes.replace_view_copy_with_view import ReplaceViewCopyWithViewPass

    table = upstream_view_targets()
    work = copy.deepcopy(graph_module)  # upstream mutates node targets in place
    before = _call_functions(work)
    result = ReplaceViewCopyWithViewPass()(work)
    after_module = result.graph_module if result is not None else work
    after = _call_functions(after_module)
    rewritten: list[str] = []
    refused: dict[str, str] = {}
    unmapped: dict[str, str] = {}
    for name, target in before.items():
        if target in table:
            now = after.get(name)
            if now is not None and now == table[target]:
                rewritten.append(name)
            elif now == target:
                refused[name] = KEPT_REASON
            else:  # upstream only retargets; say plainly if that ever changes
                refused[name] = f"upstream left {target} as {now if now is not None else 'no node'}"
        elif (op_name := view_copy_name(target)) is not None:
            unmapped[name] = op_name
    return ViewPassOutcome(after_module, rewritten, refused, unmapped)


# ================================================================================================ lowering


def _check_methods(methods: object) -> None:
    if not isinstance(methods, Mapping) or not methods:
        raise ValueError(
            "lower: argument 'methods' must be a non-empty mapping "
            f"{{name: (module, inputs[, dynamic_shapes])}}, got {methods!r}"
        )
    for name, entry in methods.items():
        if not isinstance(name, str) or not name:
            raise ValueError(
                f"lower: argument 'methods': a method name must be a non-empty str, got {name!r}"
            )
        if not isinstance(entry, (tuple, list)) or len(entry) not in (2, 3):
            raise ValueError(
                f"lower: argument 'methods': method {name!r} must be (module, inputs[, dynamic_shapes]), "
                f"got {type(entry).__name__}"
            )


def check_options(options: Mapping[str, object] | None, accepted: frozenset[str]) -> dict[str, object]:
    """The protocol's side of ``options``: a mapping of keys the adapter can hand to upstream.

    The *values* of the placement keys are not judged here: they go to upstream as given, so the suite
    sees what upstream does with a misspelt method name or a non-bool flag (``upstream_placement_config``).
    """
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ValueError(f"lower: argument 'options' must be a mapping of option keys, got {options!r}")
    for key in options:
        if key not in accepted:
            why = (
                " (upstream's AotiBackend.preprocess always runs ReplaceViewCopyWithViewPass, no switch)"
                if key == "view_pass"
                else ""
            )
            raise ValueError(
                f"lower: option {key!r} is not supported by upstream ExecuTorch{why}; accepted keys: "
                f"{', '.join(sorted(accepted))}"
            )
    return dict(options)


def _flag_for(value: object, method: str) -> object:
    """What ``value`` (a protocol flag: a bool, or ``{method: bool}``) says for ``method``, unjudged."""
    return value.get(method, False) if isinstance(value, Mapping) else value


def _export(entry: Sequence[Any]) -> Any:
    import torch

    module, inputs = entry[0], entry[1]
    dynamic_shapes = entry[2] if len(entry) > 2 else None
    # Upstream exports a host module: CudaBackend.preprocess moves the delegated program to the GPU itself
    # (move_to_device_pass), and method inputs are host tensors unless skip_h2d says otherwise.
    host = copy.deepcopy(module).to("cpu")
    args = tuple(t.to("cpu") if isinstance(t, torch.Tensor) else t for t in inputs)
    return torch.export.export(host, args, dynamic_shapes=dynamic_shapes, strict=False)


def _backend_config(options: Mapping[str, object], methods: Sequence[str]) -> Any:
    """Upstream's ``ExecutorchBackendConfig`` for the protocol's placement options, values passed as given.

    One ``PropagateDeviceConfig`` per method name, not one config holding ``{method: bool}`` mappings:
    upstream 1.5.1 hands a field's value straight to ``PropagateDevicePass``, which tests its truth, so a
    non-empty mapping would skip the copy for every method, including those mapped to False. Method names
    the options give that the program lacks are handed over too (upstream looks methods up with
    ``.get(name, PropagateDeviceConfig())``, so it ignores them: the suite's validation cases show that).
    """
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.exir.passes.propagate_device_config import PropagateDeviceConfig

    if SKIP_H2D not in options and SKIP_D2H not in options:
        return ExecutorchBackendConfig()  # upstream's defaults, what its CUDA examples use
    h2d, d2h = options.get(SKIP_H2D, False), options.get(SKIP_D2H, False)
    named = [m for value in (h2d, d2h) if isinstance(value, Mapping) for m in value]
    names = list(dict.fromkeys([*methods, *named]))
    return ExecutorchBackendConfig(
        propagate_device_config={
            m: PropagateDeviceConfig(
                skip_h2d_for_method_inputs=_flag_for(h2d, m),  # type: ignore[arg-type]
                skip_d2h_for_method_outputs=_flag_for(d2h, m),  # type: ignore[arg-type]
            )
            for m in names
        },
        enable_non_cpu_memory_planning=True,
        # A skipped copy must not get a runtime-owned buffer either (PropagateDeviceConfig's docstring).
        memory_planning_pass={
            m: MemoryPlanningPass(
                alloc_graph_input=not _flag_for(h2d, m), alloc_graph_output=not _flag_for(d2h, m)
            )
            for m in names
        },
    )


def lower_with_upstream(
    methods: Mapping[str, Sequence[Any]], options: Mapping[str, object]
) -> LoweredProgram:
    """Export every method and lower it for CUDA the way upstream's examples do (``options`` checked)."""
    from executorch.backends.cuda.cuda_backend import CudaBackend
    from executorch.backends.cuda.cuda_partitioner import CudaPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

    seconds: dict[str, float] = {}
    start = time.perf_counter()
    exported = {name: _export(entry) for name, entry in methods.items()}
    seconds["export"] = time.perf_counter() - start
    start = time.perf_counter()
    edge = to_edge_transform_and_lower(
        exported,
        partitioner={
            name: [CudaPartitioner([CudaBackend.generate_method_name_compile_spec(name)])]
            for name in exported
        },
        compile_config=EdgeCompileConfig(_check_ir_validity=False),
    )
    seconds["to_edge_transform_and_lower"] = time.perf_counter() - start
    start = time.perf_counter()
    program = edge.to_executorch(_backend_config(options, list(exported)))
    pte = program.buffer
    with tempfile.TemporaryDirectory(prefix="upstream-executorch-") as tmp:
        program.write_tensor_data_to_file(tmp)  # the public way to the external .ptd data
        data_files = {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir())}
    seconds["to_executorch"] = time.perf_counter() - start
    return LoweredProgram(pte, data_files, tuple(exported), seconds)


# ================================================================================================= backend


class ExecutorchBackend:
    """Upstream ExecuTorch as a protocol backend: parts ``view_pass`` and ``lowering`` (``cuda``)."""

    name = "executorch"
    lowering_devices = ("cuda",)
    lower_options = frozenset({SKIP_H2D, SKIP_D2H})

    def __init__(self, version: str) -> None:
        self.version = version

    def view_copy_pass(self, graph_module: GraphModule) -> ViewPassOutcome:
        return run_upstream_view_pass(graph_module)

    def lower(
        self,
        methods: Mapping[str, Sequence[Any]],
        *,
        device: str,
        options: Mapping[str, object] | None = None,
    ) -> bytes:
        """The ``.pte`` bytes of ``to_executorch(...).buffer``.

        The AOTI weights are not in them: ``CudaBackend`` stores them as external named data (a ``.ptd``
        file that upstream's runtime loads next to the ``.pte``). ``lower_program`` returns both; nothing in
        the wheel can run either (module docstring), so the suite only ever sees the ``.pte``.
        """
        return self.lower_program(methods, device=device, options=options).pte

    def lower_program(
        self,
        methods: Mapping[str, Sequence[Any]],
        *,
        device: str,
        options: Mapping[str, object] | None = None,
    ) -> LoweredProgram:
        """``lower`` with the external data files and per-stage seconds."""
        _check_methods(methods)
        if device not in self.lowering_devices:
            raise ValueError(
                f"lower: argument 'device' is {device!r}, but upstream ExecuTorch's CudaPartitioner lowers "
                f"only for {', '.join(self.lowering_devices)}"
            )
        # Keys are checked before anything is exported or compiled; placement values go to upstream as given.
        return lower_with_upstream(methods, check_options(options, self.lower_options))

    def __repr__(self) -> str:
        return f"<upstream ExecuTorch {self.version} adapter: view_pass, lowering(cuda)>"
