"""The catalogue: every normative sentence of the contract, quoted, with the rule ids that enforce it.

The contract is the plug-in protocol (``conformance/protocol.py``'s docstring) and the SPEC
(``docs/SPEC.md``). Rows follow the text's order. ``tests/conformance/test_catalogue.py`` holds the table to
the text: every normative sentence (``conformance/catalogue/text.py`` finds them) is quoted here, and every
quote is still in its source; ``tests/conformance/test_rule_coverage.py``: every rule pattern names a rule id
a case checks.

Adding a rule for a sentence: give its row the rule id (``enforced(source, quote, "family/rule")``); a gap
closed moves from ``UNCOVERED`` into ``ENTRIES`` the same way. A new sentence in the SPEC or the protocol:
the self-test names it; add its row here (enforced, informative with the reason, or uncovered).
"""

from __future__ import annotations

from conformance.catalogue.entry import Entry, enforced, informative, uncovered

PROTOCOL_INTRO = "protocol.py: intro"
KNOWN_FAILURES = "protocol.py: Known failures"
ERRORS = "protocol.py: Errors"
EVERY_CALL = "protocol.py: Every call"
MM_OUT = "protocol.py: Part mm_out"
VIEW_PASS = "protocol.py: Part view_pass"
PREFLIGHT = "protocol.py: Part preflight"
LOWERING = "protocol.py: Part lowering"
RUNTIME = "protocol.py: Part runtime"
RUNTIME_OPTIONS = "protocol.py: Part runtime_options"

#: Rule-id groups several sentences share.
MM_OUT_BAD_INPUT = (
    "mm_out/none-*", "mm_out/rank-*", "mm_out/dtype-mismatch-*", "mm_out/unsupported-dtype-*",
    "mm_out/inner-dimension", "mm_out/out-*", "mm_out/cpu-*", "mm_out/cuda-device", "mm_out/same-device",
)  # fmt: skip
CORRUPT_PROGRAM = (
    "program_format/empty", "program_format/truncated", "program_format/flipped-byte",
    "program_format/trailing-data", "program_format/not-bytes", "bad_inputs/corrupt-program",
)  # fmt: skip
BYTE_COUNTERS = (
    "runtime_options/h2d-bytes", "runtime_options/d2h-bytes", "device_placement/h2d-bytes",
    "device_placement/d2h-bytes", "multi_method/h2d-bytes", "multi_method/d2h-bytes", "differential/counters",
)  # fmt: skip
#: The differential chapter's verdicts on an error: the same calls fail, of the same kind, naming the same
#: argument as the oracle's.
DIFFERENTIAL_ERRORS = (
    "differential/missing-error",
    "differential/error-class",
    "differential/error-argument",
)
#: ``execute(..., outputs=...)``: filled on success, untouched on error, never the backend's own memory.
PROVIDED_OUTPUTS = (
    "differential/outputs-filled",
    "differential/outputs-untouched",
    "differential/outputs-owned",
)

_SUITE = "the suite's own behaviour, not the backend's"
_UPSTREAM = "describes upstream ExecuTorch, not what a backend under test must do"
_REFERENCE = "describes our reference backend's insides, which no protocol call observes"
_GPU_IMAGE = "a measured fact about the GPU image the suite runs on"

#: Normative sentences (or clauses) no rule enforces yet. An allowance, printed by the self-tests, that
#: must shrink to empty: closing one is giving it a rule id and moving it into ``ENTRIES``.
UNCOVERED: tuple[Entry, ...] = (
    uncovered(
        ERRORS,
        "A failure of the underlying library (cuBLAS, CUDA) raises ``RuntimeError``.",
        "no case provokes a failure of the library (cuBLAS, CUDA) and checks the exception's type (the "
        "differential chapter leaves a library failure of its oracle unjudged)",
    ),
    uncovered(
        PREFLIGHT,
        "prove the toolchain can build and load an artifact for ``device`` without risking the caller",
        "no case calls a backend's preflight with a broken toolchain "
        "(tests/reference_impl/test_preflight.py holds only the reference's); the suite only acts on the "
        "answer",
    ),
    uncovered(
        "SPEC §1c",
        "cuBLAS failures are internal",
        "no case provokes a cuBLAS failure and checks that it is reported as RuntimeError",
    ),
)

ENTRIES: tuple[Entry, ...] = (
    # The differential chapter lowers methods named "" or with a NUL: the oracle refuses them, so must the
    # backend.
    enforced(LOWERING, "bad names", "differential/missing-error", "differential/error-class"),
    # ============================================================================== protocol.py: intro
    informative(
        PROTOCOL_INTRO,
        "The backend plug-in protocol: the only way the suite talks to a backend.",
        f"{_SUITE} (tests/project/test_import_graph.py: conformance never imports reference_impl)",
    ),
    informative(
        PROTOCOL_INTRO,
        "A *backend* is any Python object (a module, an instance, a class) reachable as ``module:attr``.",
        "a definition, for the suite's backend loader (tests/harness/test_backend_loader.py)",
    ),
    informative(
        PROTOCOL_INTRO,
        "A backend implements any subset of the parts below; a chapter whose part is missing is skipped "
        "with that reason, never failed.",
        f"{_SUITE}: it skips a missing part, naming what the backend lacks "
        "(tests/harness/test_backend_loader.py)",
    ),
    informative(
        PROTOCOL_INTRO,
        "Nothing here needs importing: the protocols are structural (``typing.Protocol``), so a backend "
        "never depends on the suite.",
        f"{_SUITE}: structural typing (tests/project/test_import_graph.py)",
    ),
    # ===================================================================== protocol.py: Known failures
    enforced(
        KNOWN_FAILURES,
        "A matching case that fails as declared (or, under pytest-xdist, dies as declared) is ``xfailed`` "
        "with the reason and link; one that passes fails with rule ``known-failures/stale``.",
        "known-failures/stale",
    ),
    # ============================================================================= protocol.py: Errors
    enforced(
        ERRORS,
        "A contract violation raises an *invalid-argument* error: an instance of ``ValueError`` (a "
        "subclass is welcome) whose message names the offending argument (``out``, ``self`` or ``mat2`` "
        "for ``mm_out``) and the rule it broke.",
        *MM_OUT_BAD_INPUT,
        "bad_inputs/*",
        "program_format/not-bytes",
        "runtime_options/non-string-*",
        "runtime_options/unknown-key",
        "device_placement/validation",
        "device_placement/bad-input",
        *DIFFERENTIAL_ERRORS,
    ),
    enforced(
        ERRORS,
        "On any error, outputs are left untouched.",
        *MM_OUT_BAD_INPUT,
        "mm_out/arity",
        "bad_inputs/*",
        "differential/outputs-untouched",
    ),
    enforced(
        ERRORS,
        "Calling with a missing positional argument is Python's own ``TypeError``; passing ``None`` is an "
        "invalid-argument error.",
        "mm_out/arity",
        "mm_out/none-*",
        "bad_inputs/inputs-none",
        "bad_inputs/none-element",
    ),
    # ==================================================================== protocol.py: Every call
    enforced(
        EVERY_CALL,
        "A call never writes an argument it only reads: its tensors, a program's bytes, the modules and "
        "example inputs given to ``lower``.",
        "contract/inputs-untouched",
    ),
    enforced(
        EVERY_CALL,
        "A call that raises leaves the tensors it may write (``outputs=`` of ``execute``, ``out`` of "
        "``mm_out``) untouched.",
        "contract/outputs-untouched",
    ),
    enforced(
        EVERY_CALL,
        "A tensor a call returns belongs to the caller: it shares no element with an argument the call only "
        "read, nor with a tensor an earlier call returned that the caller still holds.",
        "contract/results-owned",
    ),
    enforced(
        EVERY_CALL,
        "A call returns what its signature says: ``lower`` non-empty ``bytes``, ``init`` a handle (not "
        "``None``), ``execute`` a ``list`` of tensors, ``execute_stats`` a mapping whose ``h2d_bytes`` and "
        "``d2h_bytes`` are non-negative ``int`` values, ``get_option`` a ``str``, and ``destroy``, "
        "``set_option`` and ``mm_out`` ``None``.",
        "contract/result-signature",
    ),
    enforced(
        EVERY_CALL,
        "An exception a call raises is a ``ValueError``, a ``TypeError`` or a ``RuntimeError`` (subclasses "
        "welcome), never of another class.",
        "contract/error-class",
    ),
    # ======================================================================== protocol.py: Part mm_out
    enforced(
        MM_OUT,
        "``mm_out(out, self, mat2) -> None`` computes ``out = self @ mat2`` for rank-2 CUDA tensors of one "
        "dtype (bfloat16, float16 or float32) on one device, on the caller's current CUDA stream, and "
        "returns once the work is enqueued on that stream (it must not make the caller synchronise to be "
        "correct).",
        "mm_out/values",
        "mm_out/exact-*",
        "mm_out/current-stream",
        "mm_out/no-host-sync",
        "mm_out/device",
    ),
    enforced(
        MM_OUT,
        "``self`` and ``mat2`` may be row-major, column-major (a transposed view) or arbitrarily strided; "
        "``out`` must be ``[M, N]`` and row-major contiguous, and its old contents are never read.",
        "mm_out/values",
        "mm_out/exact-integers",
        "mm_out/out-*",
        "differential/values",
    ),
    enforced(
        MM_OUT,
        "Zero-size M, N or K follow ``torch.mm``: an empty product fills ``out`` with zeros.",
        "mm_out/zero-size",
    ),
    enforced(MM_OUT, "float32 is computed in float32 without TF32.", "mm_out/no-tf32"),
    enforced(
        MM_OUT,
        "The first argument of the Python method is the backend itself, so the protocol calls the second "
        "operand ``self_``; error messages still call it ``self``.",
        "mm_out/none-self",
        "mm_out/rank-self-3d",
        "mm_out/cpu-self",
    ),
    enforced(
        MM_OUT,
        "Optional, for backends whose compiled programs call their own ``mm_out`` kernel (chapter "
        "``mm_out``, case ``test_compiled_program_calls_backend_mm_out``; without them that case is a "
        "coverage gap or a skip, never a failure): ``mm_out_calls() -> int | None`` — how many calls the "
        "backend's own ``mm_out`` kernel has served in this process so far (every entry: compiled "
        "programs and ``mm_out`` itself; None when that kernel is not loaded); "
        "``mm_out_calls_per_execute(handle) -> int | None`` — how many of those calls one ``execute`` of "
        "an ``init``-ed handle makes, as compiled (None when the handle's program calls another "
        "implementation, e.g. libtorch's ``aoti_torch_cuda_mm_out``); ``mm_out_path() -> str`` — one line "
        "naming the implementation behind ``mm_out`` (shown in the run header).",
        "mm_out/program-route",
    ),
    informative(
        MM_OUT,
        'The reference backend also takes the ``lower`` option ``"native_mm_out": bool`` (route compiled '
        "programs' ``mm`` calls to its native shim, or keep libtorch's), which the bench uses for its "
        "model-level A/B.",
        "our reference's own option, for the bench's A/B; no backend needs it",
    ),
    # ===================================================================== protocol.py: Part view_pass
    enforced(
        VIEW_PASS,
        "``view_copy_pass(graph_module) -> ViewPassOutcome`` runs the backend's ReplaceViewCopyWithViewPass "
        "on a torch.fx ``GraphModule`` (ATen ops, edge-like: views already functionalized into ``*_copy`` "
        "ops) and returns an object with ``graph_module`` (the result, runnable), ``rewritten`` (names of "
        "nodes turned into views) and ``refused`` (node name → reason)",
        "lowering/outcome",
        "lowering/report",
        "differential/view-pass-report",
        "differential/view-pass-recompiled",
    ),
    enforced(
        VIEW_PASS,
        "copies of ops the backend does not map at all go in neither list",
        "lowering/report",
        "lowering/*/missed-rewrite",
    ),
    informative(
        VIEW_PASS,
        "(the suite reports them as coverage, not as refusals; an optional ``unmapped`` mapping of node name "
        "→ op may say so explicitly).",
        f"{_SUITE}: how it reports an op the backend does not map (never a failure)",
    ),
    enforced(
        VIEW_PASS,
        "The suite judges the numerics and aliasing of the result; a verdict is only wrong where it changes "
        "what a caller sees.",
        "suite/self-check",
    ),
    # ===================================================================== protocol.py: Part preflight
    informative(
        PREFLIGHT,
        "The suite calls it once before any case runs and stops with ``message`` when ``ok`` is false, "
        "instead of crashing mid-run.",
        f"{_SUITE} (tests/conformance/test_suite_catches_broken_backends.py: the preflight reports a broken "
        "compiler)",
    ),
    # ====================================================================== protocol.py: Part lowering
    enforced(
        LOWERING,
        'the backend exports, transforms and compiles every method for ``device`` ("cpu" or "cuda") and '
        "returns one program file (its format is the backend's own business).",
        "lowering/zoo-lowers",
        "lowering/zoo",
        "lowering/lower",
        "program_format/multi-method",
        "differential/program",
    ),
    enforced(
        LOWERING, "A backend that cannot lower something raises ``ValueError``", "lowering/unsupported-*"
    ),
    enforced(LOWERING, "naming what and why.", "lowering/unsupported-kernels"),
    informative(
        LOWERING,
        "Optional attribute ``caches_methods`` (default ``False``), for speed only (no chapter checks it): "
        "true where the backend keeps each compiled method in a cache that other processes share, so that "
        "``lower`` of a program finds there every method that an earlier ``lower`` of that method alone "
        "(same module, inputs, device and options) compiled.",
        "a speed hint for the pre-lowering, never a verdict: a wrong one only costs time (the reference's "
        "claim: tests/conformance/test_prelower_jobs.py)",
    ),
    informative(
        LOWERING,
        "The pre-lowering then compiles a program's methods in processes of their own: a cold run's longest "
        "compile is one method, not a whole program.",
        f"{_SUITE} (conformance/suite/prelower.py)",
    ),
    informative(
        LOWERING,
        "``False`` lowers without the view-copy pass (the bench compares both).",
        "a bench option (speed only); the view pass itself is held by lowering/*",
    ),
    enforced(
        LOWERING,
        "each a ``bool`` (every method) or a mapping ``{method name: bool}`` (methods not named: ``False``).",
        "device_placement/output-device",
        "device_placement/d2h-copy",
        "device_placement/validation",
    ),
    enforced(
        LOWERING,
        "A method with ``skip_h2d`` takes its inputs on the device (the caller holds device tensors; "
        "nothing is copied host→device, a host tensor is an invalid-argument error); a method with "
        "``skip_d2h`` returns its outputs as ordinary CUDA tensors (nothing copied device→host).",
        "device_placement/h2d-bytes",
        "device_placement/no-h2d-copy",
        "device_placement/bad-input",
        "device_placement/output-device",
        "device_placement/d2h-bytes",
        "device_placement/no-d2h-copy",
        "device_placement/pcie",
        "device_placement/values",
        "device_placement/pipeline",
    ),
    enforced(
        LOWERING,
        "An unknown method name or a non-bool value is a ``ValueError`` naming the key and the rule",
        "device_placement/validation",
        "differential/missing-error",
    ),
    enforced(
        LOWERING,
        "raised before anything is compiled",
        # What a caller sees of the order: a model that also fails to compile gets the placement error.
        "differential/error-argument",
    ),
    enforced(
        LOWERING,
        "On a CPU target the device is the host, so both are accepted and change nothing.",
        "device_placement/cpu-target",
    ),
    # ======================================================================= protocol.py: Part runtime
    enforced(
        RUNTIME,
        "``init(program: bytes, method: str) -> handle``",
        "program_format/multi-method",
        "program_format/not-bytes",
        "bad_inputs/method-not-a-string",
    ),
    enforced(
        RUNTIME,
        "``execute(handle, inputs, outputs=None) -> list of tensors``",
        "differential/values",
        *PROVIDED_OUTPUTS,
    ),
    enforced(RUNTIME, "``destroy(handle)``", "bad_inputs/destroy-twice", "bad_inputs/execute-after-destroy"),
    enforced(
        RUNTIME,
        '``execute_stats(handle) -> {"h2d_bytes": int, "d2h_bytes": int}`` for the handle\'s last execute.',
        *BYTE_COUNTERS,
        "bad_inputs/stats-after-destroy",
    ),
    enforced(
        RUNTIME,
        "Outputs are CPU tensors unless the method keeps them on the device (export-time "
        "``skip_d2h_for_method_outputs``, or the runtime option below); then they are ordinary CUDA "
        "tensors, safe to read on any stream once execute returns.",
        "runtime_options/output-device",
        "runtime_options/cpu-target",
        "multi_method/cpu-target",
        "device_placement/output-device",
        "differential/output-device",
        "streams_threads/other-consumer",
        "streams_threads/chained-delegates",
    ),
    enforced(RUNTIME, "Host copies go through pinned memory.", "runtime_options/pinned-host-memory"),
    enforced(
        RUNTIME,
        "A corrupt program, an unknown method, a destroyed handle or wrong inputs raise ``ValueError`` "
        "naming the argument and the rule.",
        *CORRUPT_PROGRAM,
        "program_format/method-name-case",
        "bad_inputs/*",
        *DIFFERENTIAL_ERRORS,
    ),
    # =============================================================== protocol.py: Part runtime_options
    enforced(
        RUNTIME_OPTIONS,
        "``set_option(key, value)`` / ``get_option(key)``: backend-wide, before and after init, effective "
        "on the next execute.",
        "runtime_options/before-init",
        "runtime_options/after-init",
        "runtime_options/next-execute",
        "runtime_options/not-retroactive",
        "runtime_options/round-trip",
        "differential/option-read-back",
    ),
    enforced(
        RUNTIME_OPTIONS,
        "Option ``skip_copy_output_to_cpu_for_method`` names (comma-separated) the methods whose outputs "
        "stay on the device.",
        "runtime_options/option",
        "runtime_options/output-device",
        "runtime_options/list-parsing",
    ),
    enforced(
        RUNTIME_OPTIONS,
        "a method whose output placement was fixed at export time keeps that placement",
        "differential/output-device",
    ),
    enforced(
        RUNTIME_OPTIONS,
        "naming a method that was lowered with ``skip_d2h_for_method_outputs`` explicitly ``False`` is a "
        "conflict that ``lower`` and ``init`` reject with a ``ValueError`` naming both keys.",
        "device_placement/conflict",
        "differential/missing-error",
    ),
    # ==================================================================================== SPEC preamble
    informative(
        "SPEC preamble",
        "People who build a backend that lowers PyTorch programs with AOTInductor and runs them on CUDA (the "
        "ExecuTorch CUDA backend is the best-known one) use it to answer, on every commit, on a GPU CI "
        "runner: *does my backend still lower, run and copy data correctly across dtypes, shapes, "
        "multi-method models and threads — and how fast, and how many bytes cross PCIe?*",
        "the suite's purpose; the rules below make it concrete",
    ),
    informative(
        "SPEC preamble",
        "Others only where a well-kept library beats writing it ourselves.",
        "a dependency policy for our code, not for a backend",
    ),
    # ============================================================================================ SPEC §0
    informative(
        "SPEC §0",
        "The runtime option `skip_copy_output_to_cpu_for_method` is deprecated and a no-op upstream since "
        "June 2026",
        _UPSTREAM,
    ),
    enforced(
        "SPEC §0",
        "each flag a bool or a per-method mapping, covering inputs (no H2D when the caller already holds "
        "device tensors) as well as outputs.",
        "device_placement/validation",
        "device_placement/h2d-bytes",
        "device_placement/no-h2d-copy",
        "device_placement/output-device",
    ),
    informative(
        "SPEC §0",
        "Our reference keeps the runtime option (older releases ship it) and adds the export-time form.",
        "what our reference implements; the rules are runtime_options/* and device_placement/*",
    ),
    informative(
        "SPEC §0",
        "Upstream's `backends/aoti/passes/replace_view_copy_with_view.py` now maps `slice_copy`, "
        "`select_copy` and `split_copy`; it still has no source-mutation check and does not update "
        '`meta["val"]`.',
        f"{_UPSTREAM} (the hazards are lowering/source-mutated and lowering/truthful-strides)",
    ),
    informative(
        "SPEC §0",
        "`preprocess` now keeps a fresh set per call (the module-level set of §1a is gone); the error is a "
        '`RuntimeError("Method <name> missing fallback kernels (N total): ...")`.',
        f"{_UPSTREAM} (its RuntimeError is the should rule lowering/unsupported-is-valueerror)",
    ),
    informative(
        "SPEC §0",
        "Processed bytes carry content-hash keys of the `.so` and weights blobs, not the method name.",
        f"{_UPSTREAM}; a program's format is the backend's own business (protocol.py)",
    ),
    informative("SPEC §0", "Our shim stays: it is the libtorch-free reference", "what our reference ships"),
    informative(
        "SPEC §0",
        "**Upstream on PyPI** (`executorch==1.5.1`) is a CPU build: its Python AOT side (passes, "
        "partitioner, `CudaBackend.preprocess`) runs on our GPU image with torch 2.11 (a small model "
        "lowers for CUDA in ~50 s); its C++ CUDA runtime is not in the wheel.",
        f"{_UPSTREAM}: what its wheel holds",
    ),
    informative(
        "SPEC §0",
        "**PyTorch's own AOTI runtime** (`torch._inductor.aoti_compile_and_package` / `aoti_load_package`) "
        "checks inputs fully (dtype, size, stride, device) only when `AOTI_RUNTIME_CHECK_INPUTS=1`",
        "describes another backend worth testing; what it gets wrong by default is bad_inputs/*",
    ),
    # =========================================================================================== SPEC §1a
    informative(
        "SPEC §1a",
        "Upstream rewrites only `slice_copy.Tensor → slice.Tensor` (later also `select_copy.int → "
        "select.int`) by retargeting the node,",
        f"{_UPSTREAM}: its scope (ours: every view twin, below)",
    ),
    enforced(
        "SPEC §1a",
        "and skips a node when any user *blocks*: a `call_method` user; a user whose schema marks that "
        "argument as written (in-place or `out=`); a user that is itself a view op.",
        "lowering/call-method-user*",
        "lowering/written-by-user*",
        "lowering/view-user*",
    ),
    informative(
        "SPEC §1a",
        "It visits only the top-level graph; it returns `PassResult(gm, changed)`, linting and recompiling "
        "only on change.",
        f"{_UPSTREAM}: its pass interface (the protocol's is view_copy_pass -> ViewPassOutcome)",
    ),
    enforced(
        "SPEC §1a",
        "Known upstream gap: it never checks whether the **source** tensor is mutated after the slice, which "
        "turns a copy's snapshot into a live view — wrong results.",
        "lowering/source-mutated",
    ),
    informative(
        "SPEC §1a",
        'Reviewers also asked: "won\'t you have to do this for all view ops?"',
        "upstream's review history; the answer is the next sentence",
    ),
    enforced(
        "SPEC §1a",
        "Ours: every `*_copy` op that has a view twin, and it refuses a rewrite whenever the result or its "
        "base can be observed to change (mutation of the base or of the view later in the graph, aliasing "
        "into a mutated graph output, nested lists it cannot see through).",
        "lowering/every-view-twin",
        "lowering/source-mutated",
        "lowering/written-by-user",
        "lowering/aliases-output",
        "lowering/opaque-container",
        "lowering/not-viewable",
        "lowering/slicing-heavy",
        "lowering/*/policy",
        "differential/view-pass-behaviour",
    ),
    enforced(
        "SPEC §1a",
        'Update `meta["val"]` so strides are truthful.',
        "lowering/truthful-strides",
        "differential/view-pass-meta",
    ),
    enforced(
        "SPEC §1a",
        "Report what it did.",
        "lowering/report",
        "lowering/outcome",
        "differential/view-pass-report",
    ),
    informative(
        "SPEC §1a",
        '`CompileSpec(key, bytes)`; key enum with `METHOD_NAME = "method_name"`;',
        f"{_REFERENCE} (its compile specs: tests/reference_impl/test_compile_spec.py)",
    ),
    enforced(
        "SPEC §1a",
        "helpers to build the spec from a name (UTF-8) and read it back",
        "program_format/non-ascii-name",
        "program_format/method-name-case",
    ),
    informative(
        "SPEC §1a",
        "(first match wins; missing → clear error naming the specs it saw).",
        f"{_REFERENCE} (tests/reference_impl/test_compile_spec.py)",
    ),
    informative(
        "SPEC §1a",
        "Upstream reviewers preferred carrying the name **in the processed blob** so users need not pass it "
        "each time: do both — the blob carries a small versioned header with the method name and content "
        "hashes; the spec is optional and, when given, must agree.",
        f"{_REFERENCE}: the blob layout (tests/reference_impl/test_blob.py); a program's format is the "
        "backend's business",
    ),
    informative(
        "SPEC §1a",
        "Tags every delegable `call_function` node with one delegation tag; constants tagged too.",
        f"{_REFERENCE}: the partitioner (tests/reference_impl/test_preprocess.py)",
    ),
    informative(
        "SPEC §1a",
        "Per method: move to the target device; run the pass; AOTInductor-compile with the SDPA MATH kernel "
        "forced and grad disabled;",
        f"{_REFERENCE}: how it compiles (the result is held by lowering/zoo)",
    ),
    enforced(
        "SPEC §1a",
        "collect every fallback/extern kernel the generated code calls (e.g. the C-shim call "
        "`aoti_torch_cuda_mm_out`) and fail with the sorted list of those the backend does not provide (a "
        "fresh set per call — upstream kept a module-level set, so one failure poisoned every later call);",
        "lowering/unsupported-kernels",
        "lowering/failure-not-sticky",
        "metamorphic/after-failure",
    ),
    enforced(
        "SPEC §1a",
        "A multi-method program (e.g. `encoder` + `decoder`, or `prefill` + `decode`) is one file",
        "program_format/multi-method",
    ),
    enforced(
        "SPEC §1a",
        "Loading a truncated or tampered file fails with a clear error, never a crash.",
        *CORRUPT_PROGRAM,
    ),
    enforced("SPEC §1a", "CPU and CUDA targets both work;", "lowering/zoo", "program_format/cpu-target"),
    enforced(
        "SPEC §1a",
        "compiled artifacts are cached by content (model, shapes, dtypes, options, toolchain)",
        "metamorphic/variant",
    ),
    informative(
        "SPEC §1a",
        "so a warm suite does not recompile.",
        "the suite's speed; what a cache must never do (serve a stale program) is the clause before",
    ),
    # =========================================================================================== SPEC §1b
    informative(
        "SPEC §1b",
        "`init(artifact) → DelegateHandle` (holds `method_name`, the loaded AOTI runner, device, stream);",
        f"{_REFERENCE}: its handle type (a handle is opaque to the protocol)",
    ),
    enforced(
        "SPEC §1b",
        "`execute(handle, inputs, outputs=None) → outputs`;",
        "differential/values",
        *PROVIDED_OUTPUTS,
    ),
    enforced(
        "SPEC §1b", "`destroy(handle)`.", "bad_inputs/destroy-twice", "bad_inputs/execute-after-destroy"
    ),
    enforced(
        "SPEC §1b",
        "**Options** (`set_option` / `get_option`, callable before *and after* init, effective on the next "
        "execute): `skip_copy_output_to_cpu_for_method` — a method name, or a comma-separated list (tokens "
        "trimmed, empties ignored, exact case-sensitive match; a handle with no method name never matches).",
        "runtime_options/before-init",
        "runtime_options/after-init",
        "runtime_options/next-execute",
        "runtime_options/not-retroactive",
        "runtime_options/list-parsing",
        "runtime_options/list-values",
    ),
    enforced(
        "SPEC §1b",
        "A non-string value is an invalid-argument error that changes nothing (upstream applied earlier "
        "options of the same call and not later ones: we apply all or none).",
        "runtime_options/non-string-value",
        "runtime_options/all-or-nothing",
        "differential/option-read-back",
    ),
    enforced(
        "SPEC §1b",
        "Upstream limits: key ≤ 63 chars, string value ≤ 255 chars — enforce with a clear error rather than "
        "silent truncation.",
        "runtime_options/key-length",
        "runtime_options/value-length",
        "runtime_options/nul-character",
        "runtime_options/control-characters",
    ),
    enforced("SPEC §1b", "Unknown keys: decide, document, and test.", "runtime_options/unknown-key"),
    enforced(
        "SPEC §1b",
        "Inputs on the CPU go to the device through pinned staging; inputs already on the right device (e.g. "
        "the encoder's output fed to the decoder) are used without a copy.",
        "runtime_options/pinned-host-memory",
        "multi_method/device-input",
        "runtime_options/h2d-bytes",
    ),
    enforced(
        "SPEC §1b",
        "Outputs are copied to the CPU unless the handle's method is named in the skip option, in which case "
        "they stay on the GPU as ordinary CUDA tensors.",
        "runtime_options/output-device",
        "runtime_options/d2h-copy",
        "runtime_options/no-d2h-copy",
        "runtime_options/values",
        "device_placement/skip-copy-pcie",
        "differential/output-device",
        "runtime_options/default",
        "multi_method/skip-invariant",
        "multi_method/kv-cache-on-device",
    ),
    enforced("SPEC §1b", "Copies to the CPU use pinned memory", "runtime_options/pinned-host-memory"),
    enforced(
        "SPEC §1b",
        "Whatever stream the consumer uses, it must see finished data: upstream shipped bugs where a "
        "delegate returned before its stream finished (#21727) and where per-handle streams gave no "
        "ordering between delegates (9 different sums in 40 runs, #22318).",
        "streams_threads/other-consumer",
        "streams_threads/chained-delegates",
    ),
    enforced(
        "SPEC §1b",
        "Concurrent `execute` on one handle and on different handles, racing with `set_option`, is safe.",
        "streams_threads/threads",
        "differential/threads",
    ),
    enforced(
        "SPEC §1b",
        "Per-execute counters of bytes moved host→device and device→host, for the harness to cross-check.",
        *BYTE_COUNTERS,
    ),
    # =========================================================================================== SPEC §1c
    enforced(
        "SPEC §1c",
        "The symbol `aoti_torch_cuda_mm_out` is what AOTInductor-generated code calls for `aten.mm` when it "
        "picks cuBLAS; a backend that must not depend on libtorch provides its own.",
        "mm_out/program-route",
    ),
    informative("SPEC §1c", "Upstream contract (PR #19360, never merged):", "a heading: the rules follow"),
    enforced(
        "SPEC §1c",
        "dtypes bf16, fp16, fp32; all three tensors the same dtype; rank 2; `mat2.size(0) == self.size(1)`; "
        "`out` is `[M, N]` and row-major contiguous; device index sane.",
        "mm_out/unsupported-dtype-*",
        "mm_out/dtype-mismatch-*",
        "mm_out/rank-*",
        "mm_out/inner-dimension",
        "mm_out/out-*",
        "mm_out/device",
    ),
    enforced("SPEC §1c", "Errors are invalid-argument;", *MM_OUT_BAD_INPUT),
    enforced(
        "SPEC §1c",
        "Row-major operands use no transpose; column-major ones (e.g. `W.t()` from `F.linear`) use a "
        "transpose flag; any other stride pattern is copied to a contiguous scratch first.",
        "mm_out/values",
        "mm_out/exact-integers",
    ),
    enforced(
        "SPEC §1c",
        "fp32 compute (no TF32 by default), beta = 0 (old contents of `out` never read).",
        "mm_out/no-tf32",
        "mm_out/values",
    ),
    enforced(
        "SPEC §1c",
        "Upstream gaps we close: no device-type check; no same-device check; one global mutex serialising "
        "every call on every device; errors from scratch copies unchecked; non-contiguous results never "
        "value-checked; zero sizes, transposed inputs and multiple devices untested.",
        "mm_out/cuda-device",
        "mm_out/cpu-*",
        "mm_out/same-device",
        "mm_out/threads",
        "mm_out/values",
        "mm_out/zero-size",
        "mm_out/device",
    ),
    informative(
        "SPEC §1c",
        "Ours: per-device and per-thread cuBLAS handles (no global serialisation),",
        f"{_REFERENCE}: how it avoids a global lock (what a caller sees is mm_out/threads)",
    ),
    enforced(
        "SPEC §1c",
        "on the caller's current stream; `out` left untouched on any error; every error says which argument "
        "broke which rule.",
        "mm_out/current-stream",
        "mm_out/device",
        *MM_OUT_BAD_INPUT,
    ),
    # ============================================================================================ SPEC §2
    informative(
        "SPEC §2",
        "The suite tests a *backend*, not our code:",
        f"{_SUITE}: how a backend is named (tests/harness/test_backend_loader.py)",
    ),
    informative(
        "SPEC §2",
        "`conformance/` talks to the backend only through that protocol.",
        f"{_SUITE} (tests/project/test_import_graph.py)",
    ),
    enforced(
        "SPEC §2",
        "a tiny LLM-like prefill/decode with a KV cache that stays on the GPU",
        "multi_method/tokens",
        "multi_method/first-step-logits",
        "multi_method/kv-cache-on-device",
    ),
    informative(
        "SPEC §2",
        "Models are built in code with seeded random weights — no downloads.",
        f"{_SUITE}: its model zoo (tests/conformance/test_models.py)",
    ),
    enforced(
        "SPEC §2",
        "Measured here on an H200: they are **32-bit and wrap every 4 GiB** (≈80 ms at full link speed), "
        "count ~9% protocol overhead over payload, and drift ~0.5 MB/s when idle.",
        "traffic_meter/wrap",
        "traffic_meter/overhead",
        "traffic_meter/drift",
        "traffic_meter/direction",
    ),
    enforced(
        "SPEC §2",
        "So: poll fast, unwrap, subtract idle, calibrate with a known pinned transfer, map devices by UUID "
        "(NVML ignores `CUDA_VISIBLE_DEVICES`), serialise measurements (counters are device-wide), report "
        '"unsupported" as such — never 0.',
        "traffic_meter/*",
    ),
    informative(
        "SPEC §2",
        "**Timing**: CUDA events, warm-up, L2 flush, median and spread, enough repeats for a stable figure; "
        "ratios against a competitor measured in the same run (e.g. shim vs `torch.mm`).",
        f"{_SUITE}: how the bench times (tests/harness/test_timing.py)",
    ),
    informative(
        "SPEC §2",
        "**Outputs**: a versioned JSON result file (environment, every case with params, outcome, message "
        "and a one-line repro command, benchmarks, traffic), JUnit XML, and a static Jinja2 HTML dashboard "
        "(autoescaped) with history and regression verdicts against a baseline.",
        f"{_SUITE}: what a run writes (tests/harness/test_results.py, tests/reports/test_dashboard.py)",
    ),
    informative(
        "SPEC §2",
        "A GPU CI image has CUDA torch preinstalled and often no network: the sessions must be able to use "
        "that environment instead of building a venv.",
        f"{_SUITE}: its nox sessions on the GPU image",
    ),
    # ============================================================================================ SPEC §3
    informative(
        "SPEC §3",
        "The suite must detect a broken toolchain up front and say so (a preflight check), not crash "
        "mid-run.",
        f"{_SUITE} (tests/reference_impl/test_preflight.py, "
        "tests/conformance/test_suite_catches_broken_backends.py)",
    ),
    informative(
        "SPEC §3",
        "The GPU image has no `nox` and no network: bring the wheels it needs along with the working tree.",
        f"{_GPU_IMAGE}; the suite's .ci/gpu scripts bring the wheels",
    ),
)

#: The whole catalogue: what is enforced or informative, and the gaps still allowed.
CATALOGUE: tuple[Entry, ...] = ENTRIES + UNCOVERED
