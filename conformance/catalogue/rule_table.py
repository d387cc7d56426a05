"""The rule table: every rule id the suite can fail a case with, one row each (one row for a family of ids
that differ only in the part a chapter fills from its parameters), with the chapters whose cases check it,
its level and the clause a backend breaks. The one owner of rule ids and levels: chapters name their rules
through it (``conformance.common.rules.rule_id``: an id not here fails on import), levels come from it, and
the coverage table (``conformance.suite.rule_coverage``) lists exactly its ids.

*must*: a wrong result, aliasing, a crash, lost or changed data, a missing contract error. *should*: a
conservative policy, a missing optimisation, a performance contract; each *should* row says why it is one.

The sentences of the contract each rule enforces: ``entries.py`` (the sentence catalogue), which names rules
by id or by a glob over ids. Which broken backend proves a rule: the backend's ``breaks`` declaration, in
``tests/broken/*.py``.

Adding a rule: a row here, its use in a case (``X = rule_id("family/name")`` in the chapter, then
``fail(X, ...)``, the case declaring it: ``@pytest.mark.rules(X)``), and a broken backend declaring it
(README, "Adding a rule").
"""

from __future__ import annotations

from conformance.catalogue.rule import Rule, chapter, must, should

MM_OUT = "mm_out"
LOWERING = "lowering"
FORMAT = "program_format"
OPTIONS = "runtime_options"
PLACEMENT = "device_placement"
MULTI_METHOD = "multi_method"
STREAMS = "streams_threads"
BAD_INPUTS = "bad_inputs"
DIFFERENTIAL = "differential"
METAMORPHIC = "metamorphic"
TRAFFIC = "traffic_meter"

#: The chapters whose cases call the backend: each of their calls goes through the contract monitor.
MONITORED = (
    BAD_INPUTS, PLACEMENT, DIFFERENTIAL, LOWERING, METAMORPHIC, MM_OUT, MULTI_METHOD, FORMAT, OPTIONS,
    STREAMS,
)  # fmt: skip

#: The view pass's rules on one copy, by kind of situation -> why the pass must refuse (or make) the view.
#: Failure messages quote it (``conformance.lowering.view_pass_cases.RULES``).
VIEW_PASS_KINDS: dict[str, str] = {
    "call-method-user": "a call_method user blocks the rewrite (no schema says what it does to the value)",
    "written-by-user": "a user whose schema writes the argument (in-place or out=) blocks the rewrite",
    "view-user": "a user that is itself a view op blocks the rewrite",
    "source-mutated": "a write to the base (or an alias of it) after the copy blocks the rewrite",
    "aliases-output": "a returned value must not become an alias of an input or of another output",
    "opaque-container": "a value reaching a user through a container the pass cannot see through blocks it",
    "not-viewable": "a copy whose view op would fail on the base's layout is not rewritten",
    "every-view-twin": "every *_copy op with a view twin is rewritten when safe, not only slice_copy",
}
#: Kinds whose cases have a copy the SPEC refuses conservatively (``<kind>/policy``) ...
_POLICY_KINDS = ("call-method-user", "opaque-container", "source-mutated", "view-user", "written-by-user")
#: ... and whose cases have a copy that is safe to rewrite (``<kind>/missed-rewrite``).
_REWRITE_KINDS = (*sorted(VIEW_PASS_KINDS), "slicing-heavy")

#: ``mm_out(out, self, mat2)`` with one contract violation (the mm_out chapter's ``BAD_INPUTS``).
_MM_OUT_BAD_INPUTS = (
    "none-out", "none-self", "none-mat2", "rank-self-3d", "rank-mat2-1d", "rank-out-3d", "inner-dimension",
    "out-shape", "out-shape-transposed", "out-not-contiguous", "out-strided", "dtype-mismatch-mat2",
    "dtype-mismatch-out", "unsupported-dtype-float64", "unsupported-dtype-int32", "cpu-out", "cpu-self",
    "cpu-mat2",
)  # fmt: skip
#: ``execute`` with bad ``inputs`` / caller-provided ``outputs``, ``init`` of a bad method name.
_BAD_EXECUTE_INPUTS = (
    "one-input-fewer", "one-input-more", "no-inputs", "wrong-dtype-float64", "wrong-dtype-float16",
    "wrong-dtype-int64", "wrong-rank-3d", "wrong-rank-1d", "wrong-size", "wrong-size-transposed",
    "wrong-size-empty", "non-tensor-element", "none-element", "inputs-none", "inputs-a-bare-tensor",
)  # fmt: skip
_BAD_EXECUTE_OUTPUTS = (
    "outputs-one-more", "outputs-wrong-dtype", "outputs-wrong-shape", "outputs-non-tensor",
    "outputs-a-bare-tensor",
)  # fmt: skip
_BAD_METHODS = ("unknown-method", "unknown-method-empty-name", "method-not-a-string")

_METER = (
    "the traffic-meter chapter checks the NVML meter against known pinned transfers; no backend is called "
    "(its own self-tests: tests/harness/test_nvml_traffic.py and test_nvml_device.py)"
)

RULE_TABLE: tuple[Rule, ...] = (
    # ============================================================================================== mm_out
    *chapter(
        MM_OUT,
        must("mm_out/values", "out ≈ self @ mat2 within the dtype's tolerance, any layout; out never read"),
        must("mm_out/exact-ones", "ones[1, 2048] @ ones[2048, 256] is exactly 2048 in every dtype"),
        must("mm_out/exact-identity", "I @ diag(d) == diag(d) bit for bit"),
        must("mm_out/exact-integers", "small integer operands give the exact integer product"),
        must("mm_out/no-tf32", "float32 is computed in float32, never TF32"),
        must("mm_out/zero-size", "empty M or N is a no-op; K = 0 gives zeros (torch.mm's semantics)"),
        must("mm_out/current-stream", "the product is ordered after earlier work on the caller's stream"),
        # A shim that drains the stream first is slower, not wrong (mm_out/current-stream, a must, checks
        # the values).
        should("mm_out/no-host-sync", "mm_out returns once the work is enqueued, never draining the stream"),
        must("mm_out/threads", "calls from several threads each equal the serial result; no deadlock"),
        must("mm_out/device", "tensors on cuda:1 are computed on device 1; the current device stays"),
        must(
            "mm_out/{bad_input}",
            "a contract violation is an invalid-argument error naming the argument and rule; out untouched",
            bad_input=_MM_OUT_BAD_INPUTS,
        ),
        must("mm_out/arity", "a missing argument is Python's TypeError naming it; out untouched"),
        must("mm_out/same-device", "tensors on two devices are an invalid-argument error; out untouched"),
        must("mm_out/cuda-device", "CPU tensors are an invalid-argument error naming one; out untouched"),
        must("mm_out/program-route", "a compiled program's mm_out calls reach the backend's own mm_out"),
    ),
    # ============================================================================================ lowering
    *chapter(
        LOWERING,
        *(must(f"lowering/{kind}", why) for kind, why in VIEW_PASS_KINDS.items()),
        # A copy the SPEC refuses conservatively (no schema, a view user, a container it cannot see through)
        # became a view and the result is still right; a wrong result stays the must rule lowering/<kind>.
        should(
            "lowering/{kind}/policy",
            "a copy the SPEC refuses conservatively stays a copy, even where its view gives the same result",
            kind=_POLICY_KINDS,
        ),
        # A safe copy the backend maps but refused: a missing optimisation (an unmapped op is coverage).
        should(
            "lowering/{kind}/missed-rewrite",
            "a safe copy of an op the backend maps becomes a view, not a refusal",
            kind=_REWRITE_KINDS,
        ),
        must(
            "lowering/outcome",
            "the pass returns a ViewPassOutcome (graph module, rewritten, refused) and never raises",
            also=(DIFFERENTIAL,),
        ),
        # The rewritten list disagrees with the result graph: the report is off, the program is not.
        should(
            "lowering/report",
            "the outcome's rewritten list is exactly the copies that are views in the result graph",
            also=(DIFFERENTIAL,),
        ),
        must("lowering/truthful-strides", "every rewritten node's meta['val'] matches a real run"),
        must(
            "lowering/slicing-heavy",
            "a slicing-heavy graph (KV-cache attention, Hugging Face methods) keeps its behaviour",
        ),
        must("lowering/zoo-lowers", "every zoo model lowers into program bytes, or says why it cannot"),
        must("lowering/zoo", "every lowered zoo method runs and matches eager float64"),
        must(
            "lowering/unsupported-kernels",
            "a method calling an op with no kernel is refused with a ValueError naming what is missing",
        ),
        # The backend said clearly that it cannot lower, but as RuntimeError, not the protocol's ValueError
        # (upstream ExecuTorch: "Method ... missing fallback kernels"): a contract nit, not a hazard.
        should(
            "lowering/unsupported-is-valueerror",
            "a backend that cannot lower something raises ValueError, not RuntimeError",
        ),
        must("lowering/failure-not-sticky", "a failed lower leaves the next lower unaffected"),
        must(
            "suite/self-check",
            "the suite's premises hold: hazard copies are observable, float32 greedy paths have no near-ties",
            exempt="the suite's proof of its own catalogue; no backend is called",
            also=(MULTI_METHOD,),
        ),
    ),
    # The lowering chapter's rule wherever a runtime chapter's case lowers the model it runs
    # (conformance/programs.py): a backend that cannot lower it fails the case. The lowering chapter's own
    # cases name what they lower by rules of their own (lowering/zoo-lowers, lowering/unsupported-kernels).
    must(
        "lowering/lower",
        "the backend lowers the model the case runs",
        also=(OPTIONS, PLACEMENT, MULTI_METHOD),
    ),
    # ============================================================================== compile specs & format
    *chapter(
        FORMAT,
        must("program_format/multi-method", "one program of several methods initialises each by its name"),
        must(
            "program_format/non-ascii-name", "non-ASCII method names round-trip and initialise by that name"
        ),
        must(
            "program_format/method-name-case",
            "a name differing in case (or a prefix of one) is not the method",
        ),
        must("program_format/empty", "init of empty bytes is an invalid-argument error blaming the program"),
        must(
            "program_format/not-bytes", "a program that is not bytes is an invalid-argument error naming it"
        ),
        must(
            "program_format/truncated", "a truncated program is an invalid-argument error blaming the program"
        ),
        must("program_format/trailing-data", "bytes after the program's end are refused as tampering"),
        must(
            "program_format/flipped-byte", "one flipped byte anywhere is refused: the file is refused whole"
        ),
        must(
            "program_format/cpu-target", "a program lowered for the CPU runs on the CPU where CUDA is present"
        ),
    ),
    # ===================================================================================== runtime options
    *chapter(
        OPTIONS,
        must("runtime_options/round-trip", "the option is set and read back, naming the same methods"),
        must("runtime_options/all-or-nothing", "a set_option that fails changes nothing"),
        must("runtime_options/before-init", "the option can be set and read with no handle in existence"),
        must("runtime_options/list-values", "every well-formed method list is accepted"),
        must("runtime_options/non-string-value", "a value that is not a str is an invalid-argument error"),
        must("runtime_options/non-string-key", "a key that is not a str is an invalid-argument error"),
        must("runtime_options/key-length", "a key over 63 characters is an error, never truncated"),
        must("runtime_options/value-length", "a value over 255 characters is an error, never truncated"),
        must("runtime_options/unknown-key", "set_option and get_option reject an unknown key, naming it"),
        must("runtime_options/nul-character", "a key or value containing NUL is an invalid-argument error"),
        must(
            "runtime_options/control-characters",
            "a control character is kept exactly or refused, never dropped",
        ),
        must(
            "runtime_options/after-init", "with handles alive the option is set and read; executes stay right"
        ),
        must("runtime_options/next-execute", "a change of the option takes effect on the next execute"),
        must("runtime_options/not-retroactive", "outputs already returned stay where they are, unchanged"),
        must(
            "runtime_options/list-parsing", "a list keeps exactly the methods it names (trimmed, exact match)"
        ),
        must("runtime_options/default", "never set, the option names no method: every output is copied out"),
        must("runtime_options/option", "the option is accepted for every method list of the matrix"),
        must(
            "runtime_options/output-device",
            "a method the option names returns CUDA tensors, others host ones",
        ),
        must("runtime_options/values", "values match float64 eager whatever the option says"),
        must("runtime_options/d2h-bytes", "execute_stats counts exactly the output bytes copied to the host"),
        must("runtime_options/h2d-bytes", "execute_stats counts exactly the host inputs' bytes"),
        must("runtime_options/d2h-copy", "outputs the option does not keep are copied device→host"),
        # The option kept the outputs on the device (runtime_options/output-device, a must), yet the profiler
        # saw a device→host copy: bandwidth wasted, nothing the caller gets is wrong.
        should("runtime_options/no-d2h-copy", "outputs the option keeps are never copied device→host"),
        must("runtime_options/cpu-target", "on a CPU target the option changes nothing and moves 0 bytes"),
        # Pageable copies are slower, not wrong: host staging through pinned memory is a performance contract.
        should(
            "runtime_options/pinned-host-memory",
            "every host↔device copy uses pinned host memory",
            also=(PLACEMENT,),
        ),
    ),
    # ==================================================================================== device placement
    *chapter(
        PLACEMENT,
        must("device_placement/validation", "an unknown method or a non-bool placement value is refused"),
        must(
            "device_placement/conflict", "placement contradicting the runtime option is refused, naming both"
        ),
        must("device_placement/output-device", "a method lowered with skip_d2h returns CUDA tensors"),
        must("device_placement/values", "values match float64 eager whatever the placement"),
        must(
            "device_placement/d2h-bytes", "execute_stats counts exactly the output bytes copied to the host"
        ),
        must("device_placement/h2d-bytes", "execute_stats counts exactly the host inputs' bytes"),
        must("device_placement/d2h-copy", "outputs not placed on the device are copied device→host"),
        # The same for export-time placement: values and placement are must rules of their own.
        should("device_placement/no-d2h-copy", "outputs placed on the device are never copied device→host"),
        should("device_placement/no-h2d-copy", "inputs placed on the device are never copied host→device"),
        must("device_placement/pipeline", "a device-resident pipeline moves 0 bytes either way"),
        must(
            "device_placement/bad-input", "a device-input method refuses host, other-GPU, wrong-dtype inputs"
        ),
        # What NVML saw cross PCIe did not drop by the kept tensors' bytes: staged through the host anyway.
        should(
            "device_placement/skip-copy-pcie",
            "PCIe traffic (NVML) drops by the bytes the option keeps on the device",
        ),
        should(
            "device_placement/pcie", "PCIe traffic (NVML) drops by the bytes placement keeps on the device"
        ),
        must("device_placement/cpu-target", "on a CPU target placement changes nothing and moves 0 bytes"),
    ),
    # ======================================================================================== multi-method
    *chapter(
        MULTI_METHOD,
        must("multi_method/tokens", "the greedy pipeline gives eager PyTorch's tokens", also=(PLACEMENT,)),
        must("multi_method/first-step-logits", "half precision: the first step's logits are close"),
        must("multi_method/skip-invariant", "skip-copy changes where outputs go, never the values"),
        must("multi_method/cpu-target", "on a CPU target every execute moves 0 bytes"),
        must("multi_method/h2d-bytes", "execute_stats counts exactly the host inputs' bytes"),
        must("multi_method/d2h-bytes", "execute_stats counts exactly the output bytes copied out"),
        # The optimisation the skip-copy option exists for; the tokens (multi_method/tokens) and the byte
        # counters' truth (multi_method/h2d-bytes, d2h-bytes) stay must.
        should("multi_method/kv-cache-on-device", "prefill and decode skipped: KV caches stay on GPU"),
        must("multi_method/device-input", "the encoder's kept output feeds the decoder, no upload"),
    ),
    # =================================================================================== streams & threads
    *chapter(
        STREAMS,
        must("streams_threads/other-consumer", "a consumer on another stream reads finished outputs"),
        must(
            "streams_threads/chained-delegates", "a second handle fed a kept output sees the finished result"
        ),
        must("streams_threads/threads", "concurrent executes (racing the option) equal the serial results"),
    ),
    # ========================================================================================== bad inputs
    *chapter(
        BAD_INPUTS,
        must(
            "bad_inputs/{bad_input}",
            "execute with bad inputs is an invalid-argument error naming inputs; nothing changes",
            bad_input=_BAD_EXECUTE_INPUTS,
        ),
        must(
            "bad_inputs/{bad_output}",
            "execute with bad caller-provided outputs is an invalid-argument error naming outputs; untouched",
            bad_output=_BAD_EXECUTE_OUTPUTS,
        ),
        must(
            "bad_inputs/{bad_method}",
            "init of a method the program lacks is an invalid-argument error naming method",
            bad_method=_BAD_METHODS,
        ),
        must("bad_inputs/wrong-device", "a CUDA input to a CPU program is refused naming inputs"),
        must("bad_inputs/other-gpu", "an input on another GPU is refused naming inputs"),
        must("bad_inputs/outputs-wrong-device", "CUDA outputs where outputs go to the CPU are refused"),
        must("bad_inputs/execute-after-destroy", "execute on a destroyed handle is an invalid argument"),
        must("bad_inputs/destroy-twice", "destroying a handle twice is an invalid argument"),
        must("bad_inputs/stats-after-destroy", "execute_stats of a destroyed handle: invalid argument"),
        must("bad_inputs/not-a-handle", "execute on what init did not return is an invalid argument"),
        must("bad_inputs/corrupt-program", "init of a corrupt program is an invalid argument blaming it"),
    ),
    # ======================================================================================== differential
    *chapter(
        DIFFERENTIAL,
        must("differential/program", "lower returns program bytes"),
        must("differential/values", "results match the oracle's (eager float64) within tolerance"),
        must("differential/inputs-untouched", "execute (and mm_out) never write their inputs"),
        must("differential/outputs-untouched", "a refused call leaves caller-provided outputs alone"),
        must("differential/outputs-filled", "execute fills caller-provided outputs and returns them"),
        must("differential/outputs-owned", "returned outputs are never the backend's reused memory"),
        must("differential/output-device", "outputs are where the option and placement say"),
        must("differential/counters", "execute_stats counts exactly the bytes the execute copied"),
        must("differential/threads", "a valid execute racing others behaves as it would alone"),
        must(
            "differential/result-structure",
            "what a call returns has the oracle's structure: container, length, each tensor's class, dtype, "
            "shape, device, layout and requires_grad, a mapping's keys and value types",
        ),
        must("differential/option-read-back", "get_option returns what set_option set"),
        must("differential/missing-error", "a call the oracle refuses is refused by the backend too"),
        must("differential/spurious-error", "a call the oracle accepts is accepted by the backend too"),
        must("differential/error-class", "an error is of the oracle's kind (ValueError, TypeError)"),
        must("differential/error-argument", "an error names the argument the oracle's names"),
        must("differential/view-pass-behaviour", "on generated graphs the result behaves alike"),
        must("differential/view-pass-meta", "on generated graphs every view's meta['val'] is true"),
        must("differential/view-pass-recompiled", "the returned module runs its own graph's code"),
        # The report contradicts itself (a node both rewritten and refused) or names nodes the result lacks.
        should(
            "differential/view-pass-report",
            "the outcome never reports a node both rewritten and refused, nor nodes the result lacks",
        ),
    ),
    # ========================================================================================= metamorphic
    *chapter(
        METAMORPHIC,
        must("metamorphic/variant", "a variant lowered after its base is its own program"),
        must("metamorphic/after-failure", "after failed lowers the next is as a fresh process makes it"),
    ),
    # ======================================================================================= traffic meter
    *chapter(
        TRAFFIC,
        must("traffic_meter/calibration", "the meter calibrates on a known pinned transfer", exempt=_METER),
        # The counter direction differs from NVML's documentation; the meter follows its calibration, so the
        # figures stay correct: a note for whoever maintains the driver, not a wrong measurement.
        should("traffic_meter/direction", "NVML's counters count the direction documented", exempt=_METER),
        must("traffic_meter/overhead", "protocol overhead over payload is within bounds", exempt=_METER),
        must("traffic_meter/valid", "every measurement is valid", exempt=_METER),
        must("traffic_meter/accuracy", "a measured transfer is within tolerance of its bytes", exempt=_METER),
        must("traffic_meter/wrap", "a transfer past the 32-bit counters' wrap is measured", exempt=_METER),
        must("traffic_meter/drift", "the idle counters' drift is measured and small", exempt=_METER),
    ),
    # ===================== the contract monitor (conformance/common/contract_monitor.py): every call of every
    # case that asks for the backend, whatever its chapter
    must(
        "contract/inputs-untouched",
        "no call writes an argument it only reads (tensors, program bytes, lower's modules and inputs)",
        also=MONITORED,
    ),
    must(
        "contract/outputs-untouched",
        "a call that raises leaves outputs= and out as they were",
        also=MONITORED,
    ),
    must(
        "contract/results-owned",
        "a returned tensor shares no element with a read-only argument or a result the caller holds",
        also=MONITORED,
    ),
    must("contract/result-signature", "every call returns what its signature declares", also=MONITORED),
    must(
        "contract/error-class",
        "an exception is a ValueError, TypeError or RuntimeError, never another",
        also=MONITORED,
    ),
    # ========================================================== the known-failures plugin (no chapter's case)
    must(
        "known-failures/stale",
        "a case declared a known failure that passes fails: the list cannot rot",
        exempt="about the known-failures list, not the backend: a declared failure that passes "
        "(tests/conformance/test_case_outcomes.py proves it)",
    ),
    # ===================================== the suite's declarations (conformance/common/declared_rules.py)
    must(
        "suite/undeclared-rule",
        "a case fails only under the rule ids it declares",
        exempt="about the suite's own declarations, not the backend: a case failing under a rule it does "
        "not declare (tests/conformance/test_rule_coverage.py proves it)",
    ),
)
