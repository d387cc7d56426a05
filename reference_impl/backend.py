"""The reference backend as the suite sees it: one object implementing the plug-in protocol."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from reference_impl._version import __version__

if TYPE_CHECKING:
    import torch
    from torch.fx import GraphModule

    from reference_impl.runtime.options import OptionStore


@dataclass(frozen=True)
class ViewPassOutcome:
    """What the protocol's ``view_copy_pass`` returns: the result and the pass's verdicts."""

    graph_module: GraphModule
    rewritten: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)


class _MmOutBinding:
    """``backend.mm_out``: the chosen path's entry itself, bound into the instance on first access.

    On the native path that is the extension's builtin function, so ``backend.mm_out(out, a, b)`` (and a
    caller that kept ``mm = backend.mm_out`` before its first call) runs no Python frame per call. Chosen on
    first *access*, not at import, so that loading the backend never builds or loads cuBLAS. When choosing
    fails (``$REFIMPL_MM_OUT_PATH=native`` without a native shim), access still works and each call raises
    why, as a call of the old method did.
    """

    def __get__(self, instance: object, owner: type | None = None) -> Callable[..., Any]:
        if instance is None:
            return self._choose_and_call
        from reference_impl.shims.path import mm_out_entry

        try:
            entry = mm_out_entry()
        except Exception:  # reported by the call, not by attribute access
            return lambda out, self_, mat2, /: self._choose_and_call(instance, out, self_, mat2)
        instance.__dict__["mm_out"] = entry
        return entry

    @staticmethod
    def _choose_and_call(instance: object, out: Any, self_: Any, mat2: Any, /) -> None:
        from reference_impl.shims.path import mm_out_entry

        entry = mm_out_entry()
        instance.__dict__["mm_out"] = entry
        entry(out, self_, mat2)


class ReferenceBackend:
    """Implements the protocol of ``conformance/protocol.py`` by delegating to the reference parts."""

    name = "reference_impl"
    version = __version__
    lowering_devices = ("cpu", "cuda")
    # Its artifact cache is keyed by each method's traced graph, shared on disk by every process.
    caches_methods = True
    lower_options = frozenset(
        {"view_pass", "skip_h2d_for_method_inputs", "skip_d2h_for_method_outputs", "native_mm_out"}
    )

    # ``mm_out(out, self, mat2, /) -> None``: the chosen path's entry, bound on first access.
    mm_out = _MmOutBinding()

    def __init__(self, *, own_options: bool = False) -> None:
        """``own_options``: keep this instance's options in a store of its own instead of the process-wide
        one every handle reads by default: a backend whose options no other instance sees (the differential
        chapter's oracle, ``ORACLE``). Made on first use, so that loading the backend stays cheap."""
        self._own_options = own_options
        self._options: OptionStore | None = None
        self._options_made = threading.Lock()

    @property
    def _store(self) -> OptionStore:
        from reference_impl.runtime.options import STORE, OptionStore

        if not self._own_options:
            return STORE
        with self._options_made:
            if self._options is None:
                self._options = OptionStore()
            return self._options

    def mm_out_path(self) -> str:
        """Which ``mm_out`` implementation runs here, and why (for run headers)."""
        from reference_impl.shims.path import describe_path

        return describe_path()

    def mm_out_calls(self) -> int | None:
        """Optional protocol attribute: calls the native shim served in this process (None: not loaded)."""
        from reference_impl.shims.native.library import call_counts

        counts = call_counts()
        return None if counts is None else counts["calls"]

    def mm_out_calls_per_execute(self, handle: object) -> int | None:
        """Optional protocol attribute: native-shim calls one execute of ``handle`` makes (as compiled);
        None when its program calls libtorch's ``aoti_torch_cuda_mm_out`` instead."""
        route = getattr(handle, "mm_out_route", None)
        if not isinstance(route, dict) or route.get("provider") != "native":
            return None
        return int(route.get("call_sites", 0))

    def view_copy_pass(self, graph_module: GraphModule) -> ViewPassOutcome:
        from reference_impl.lowering.view_copy_pass import run_view_copy_pass

        result, report = run_view_copy_pass(graph_module)
        return ViewPassOutcome(
            graph_module=result,
            rewritten=[r.node for r in report.rewrites],
            refused={r.node: str(r.reason.value) for r in report.refusals},
        )

    def lower(
        self, methods: Mapping[str, tuple], *, device: str, options: Mapping[str, object] | None = None
    ) -> bytes:
        """Lower every ``(module, inputs[, dynamic_shapes])`` method into one program file.

        ``options`` (keys in ``lower_options``): ``view_pass: bool`` (False lowers without the view-copy
        pass, for the bench's A/B); ``skip_h2d_for_method_inputs`` / ``skip_d2h_for_method_outputs``:
        export-time device placement (``format/placement.py``), validated before anything compiles;
        ``native_mm_out: bool``: route CUDA programs' ``aoti_torch_cuda_mm_out`` calls to the native shim
        (True) or keep libtorch's (False); default: the native shim when it is available.
        """
        from reference_impl.format.placement import PlacementError, placement_conflicts, resolve_placement
        from reference_impl.lowering.lower import lower_program
        from reference_impl.runtime.options import SKIP_COPY_OUTPUT_TO_CPU_FOR_METHOD

        if options is not None and not isinstance(options, Mapping):
            raise ValueError(f"lower: argument 'options' must be a mapping, got {type(options).__name__}")
        opts = dict(options or {})
        unknown = sorted(set(opts) - self.lower_options)
        if unknown:
            raise ValueError(
                f"lower: argument 'options' has unknown key(s) {unknown}; known: {sorted(self.lower_options)}"
            )
        if not isinstance(opts.get("view_pass", True), bool):
            raise ValueError(f"lower: option 'view_pass' must be a bool, got {opts['view_pass']!r}")
        if not isinstance(opts.get("native_mm_out", True), bool):
            raise ValueError(f"lower: option 'native_mm_out' must be a bool, got {opts['native_mm_out']!r}")
        if not isinstance(methods, Mapping):
            raise ValueError(f"lower: argument 'methods' must be a mapping, got {type(methods).__name__}")
        placements = resolve_placement(opts, methods)
        conflicts = placement_conflicts(placements, self._store.skip_copy_methods())
        if conflicts:
            raise PlacementError(
                f"option 'skip_d2h_for_method_outputs' is False for {conflicts}, but the runtime option "
                f"{SKIP_COPY_OUTPUT_TO_CPU_FOR_METHOD!r} names them: conflicting placement "
                "(export time wins; drop one of the two)"
            )
        plain = {name: (entry[0], entry[1]) for name, entry in methods.items()}
        shapes = {name: e[2] for name, e in methods.items() if len(e) > 2 and e[2] is not None}
        return lower_program(
            plain,
            device=device,
            dynamic_shapes=shapes or None,
            view_pass=bool(opts.get("view_pass", True)),
            placement=placements,
            native_mm_out=opts.get("native_mm_out"),
        )

    def preflight(self, device: str) -> tuple[bool, str]:
        """Compile, load and run a trivial artifact in a subprocess (a broken compiler cannot kill us)."""
        from reference_impl.lowering.preflight import check_toolchain

        report = check_toolchain(device)
        return report.ok, report.render()

    # Runtime part: thin forwards, imported on use so that loading the backend stays cheap.
    def init(self, program: bytes, method: str) -> object:
        from reference_impl import runtime

        return runtime.init(program, method, options=self._store)

    def execute(
        self, handle: object, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        from reference_impl import runtime

        return runtime.execute(handle, inputs, outputs)  # type: ignore[arg-type]

    def destroy(self, handle: object) -> None:
        from reference_impl import runtime

        runtime.destroy(handle)  # type: ignore[arg-type]

    def execute_stats(self, handle: object) -> dict[str, int]:
        from reference_impl import runtime

        return runtime.execute_stats(handle)  # type: ignore[arg-type]

    def set_option(self, key: str, value: object) -> None:
        self._store.set_option(key, value)

    def get_option(self, key: str) -> object:
        return self._store.get_option(key)


BACKEND = ReferenceBackend()
#: The same backend with options of its own: the oracle of the differential chapter, judged side by side with
#: the backend under test in one process (which may itself wrap ``BACKEND``) without sharing its options.
ORACLE = ReferenceBackend(own_options=True)
