"""Chapter multi_method — multi-method models end to end (SPEC §1b, §2; protocol part ``runtime``).

The zoo's multi-method models run as real pipelines through ``conformance/common/pipelines.py``: ASR kind
(encoder once, then the decoder for ``ASR_STEPS`` greedy steps on the growing sequence) and LLM kind (prefill
the prompt, then decode through the KV cache, ``LLM_STEPS`` tokens). The pipeline models are the zoo's own
``asr`` and ``llm`` and, with ``transformers`` installed (extra ``hf``), the Hugging Face architectures
``hf_whisper`` (Whisper encoder + decoder) and ``hf_llm`` (Qwen3 prefill + decode over HF's ``StaticCache``);
without it those cases are skipped with the reason. Every check names its rule, ``multi_method/<rule>``.

Oracle, and why half precision is judged differently
    Eager PyTorch runs the very same greedy loops (``conformance.models``) on the same modules, with SDPA's
    math kernel (what the lowering compiles). float32 tokens must match **exactly**: the suite checks itself
    (``test_suite_self_check_float32_paths_have_no_near_ties``) that no step of these paths has its two best
    logits closer than float32 rounding could move them, so any difference is a bug.
    In float16 and bfloat16 a compiler that fuses ops rounds at other places than eager does (both are
    ~1e-3 / ~1e-2 off float64), so a step whose two best logits are that close may legitimately pick the
    other token — and from there the rest of that row differs. A fixed "agreement ≥ x %" would be arbitrary
    (one legitimate flip at step 0 leaves a row 0 % in agreement; garbage can agree by chance), so the rule
    is instead: (1) the first step's logits are within ``MODEL_TOLERANCES`` of float64 eager, and (2) in each
    row, the first token that differs from eager must sit on a **near-tie**: in float64, with the common
    prefix teacher-forced, the logits of the two candidate tokens differ by at most
    ``2 · tol · ‖logits‖₂`` — the most that two computations each within the norm-wise tolerance can move
    them (each elementwise error is bounded by the norm). The agreement fraction is recorded, not judged.

Data movement (CUDA)
    With skip-copy on both LLM methods, the KV cache never leaves the GPU: per decode step ``d2h_bytes == 0``
    and ``h2d_bytes`` is only the token and position. With ``encoder`` skipped, the decoder consumes the
    encoder's GPU output as it is: per decoder step ``h2d_bytes`` is only the token ids. Byte totals with and
    without skip are recorded on the case (``user_properties`` and result-file params). Latency is not timed
    here: these cases share their GPU with other workers; the bench (suites ``pipelines`` and ``models``)
    measures it alone on the GPU, as a ratio against eager in the same run.

Programs lowered: each pipeline model in float32 for the CPU (2, or 4 with ``transformers``); on CUDA also
each × float32, float16, bfloat16 (6 or 12) — the same ones ``test_runtime_options.py`` uses, so they are
lowered once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from conformance.common.checks import fail
from conformance.common.parts import LoweringRuntimeBackend, require_part, skip_reason
from conformance.common.pipelines import PIPELINE_MODELS, CallStats, pipeline_params, run_greedy
from conformance.common.programs import (
    LOWER,
    SKIP_COPY_OPTION,
    LoweredModel,
    handles,
    lower_or_fail,
    option,
    record,
)
from conformance.common.rules import rule_id
from conformance.common.token_oracle import (
    METHODS,
    NEAR_TIE_FACTOR,
    STEPS,
    TOKENS,
    Methods,
    as_float64,
    check_tokens,
    eager_tokens,
    float64_module,
    float64_path_logits,
    host_inputs,
)
from conformance.common.tolerances import DTYPES_BY_NAME, MODEL_TOLERANCES
from conformance.protocol import RuntimeBackend

SKIP = SKIP_COPY_OPTION
DTYPES = list(DTYPES_BY_NAME)

# The rules this module checks (conformance/catalogue/rule_table.py).
FIRST_STEP_LOGITS = rule_id("multi_method/first-step-logits")
SKIP_INVARIANT = rule_id("multi_method/skip-invariant")
CPU_TARGET = rule_id("multi_method/cpu-target")
SELF_CHECK = rule_id("suite/self-check")
H2D_BYTES = rule_id("multi_method/h2d-bytes")
D2H_BYTES = rule_id("multi_method/d2h-bytes")
KV_CACHE_ON_DEVICE = rule_id("multi_method/kv-cache-on-device")
DEVICE_INPUT = rule_id("multi_method/device-input")

INT64_BYTES = 8

PIPELINE_CASES = [
    pytest.param("cpu", "float32", id="cpu-float32"),
    *(pytest.param("cuda", dt, marks=pytest.mark.gpu, id=f"cuda-{dt}") for dt in DTYPES),
]


# ================================================================================================ helpers


def run_pipeline(
    backend: RuntimeBackend,
    model: str,
    eager: Methods,
    made: Sequence[object],
    stats: CallStats | None = None,
) -> torch.Tensor:
    first, second = made
    first_input = host_inputs(eager, METHODS[model][0])[0]
    return run_greedy(backend, model, first, second, first_input, STEPS[model], stats)


def first_step_logits(
    backend: RuntimeBackend, model: str, lm: LoweredModel, made: Sequence[object]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(backend, float64 eager) logits of the pipeline's first step: the decoder on [BOS] after the encoder,
    or prefill over the prompt."""
    eager = lm.eager
    first, second = made
    p = PIPELINE_MODELS[model]
    first_name, second_name = p.methods
    if p.kind == "asr":
        features = host_inputs(eager, first_name)
        hidden = backend.execute(first, features)[0]
        bos = torch.full((features[0].shape[0], 1), p.greedy.bos, dtype=torch.int64)
        got = backend.execute(second, [bos, hidden])[0]
        with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
            ref = float64_module(eager, second_name)(
                bos, float64_module(eager, first_name)(as_float64(features[0]))
            )
        return got, ref
    prompt = host_inputs(eager, first_name)
    got = backend.execute(first, prompt)[0]
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        ref = float64_module(eager, first_name)(prompt[0])[0]
    return got, ref


# ========================================================================================== token parity


@pytest.mark.rules(LOWER, TOKENS, FIRST_STEP_LOGITS, SKIP_INVARIANT, CPU_TARGET)
@pytest.mark.parametrize(("device", "dtype"), PIPELINE_CASES)
@pytest.mark.parametrize("model", pipeline_params())
def test_pipeline_tokens_match_eager(
    runtime: LoweringRuntimeBackend, model: str, device: str, dtype: str, request: pytest.FixtureRequest
) -> None:
    """multi_method/tokens: the greedy pipeline through the protocol gives eager PyTorch's tokens (float32:
    exactly; half precision: first-step logits within tolerance, differences only from near-ties); on a CPU
    target every execute moves 0 bytes, with skip-copy or without."""
    backend = runtime
    lm = lower_or_fail(backend, model, dtype, device)
    call = f"{model} pipeline ({dtype}, {device}, {STEPS[model]} steps)"
    want = eager_tokens(model, lm.eager).cpu()
    with handles(backend, lm.program, *METHODS[model]) as made:
        with option(backend, SKIP, ""):
            stats: CallStats = []
            got = run_pipeline(backend, model, lm.eager, made, stats)
            if lm.dtype != torch.float32:
                first_got, first_ref = first_step_logits(backend, model, lm, made)
        if lm.dtype != torch.float32:
            err = float((first_got.detach().cpu().double() - first_ref).norm() / first_ref.norm())
            record(request, first_step_logits_error=round(err, 6))
            tol = MODEL_TOLERANCES[lm.dtype]
            if not err <= tol:
                why = f"relative L2 error {err:.3g} against float64 eager exceeds {tol:g}"
                fail(FIRST_STEP_LOGITS, call, why)
        if got.shape == want.shape:
            record(request, token_agreement=round(float((got == want).double().mean()), 4))
        flips = check_tokens(model, lm, got, want, call)
        record(request, near_tie_flips=len(flips))
        if device != "cpu":
            return
        # A CPU target: the runtime option (where the backend has one) changes nothing, and no execute
        # moves a byte.
        if not skip_reason(backend, "runtime_options"):
            with option(backend, SKIP, ",".join(METHODS[model])):
                skipped = run_pipeline(backend, model, lm.eager, made, stats)
            if not torch.equal(skipped, got):
                why = "tokens changed when skip-copy was set on a CPU target"
                fail(SKIP_INVARIANT, call, why)
    moved = [(m, s) for m, s in stats if s.get("h2d_bytes") != 0 or s.get("d2h_bytes") != 0]
    if moved:
        fail(CPU_TARGET, call, f"a CPU target moved bytes: {moved[:3]}")


@pytest.mark.rules(SELF_CHECK)
@pytest.mark.parametrize("model", pipeline_params())
@pytest.mark.suite_check
def test_suite_self_check_float32_paths_have_no_near_ties(model: str) -> None:
    """suite/self-check (no backend): along eager's float32 greedy paths, every step's best logit beats the
    runner-up by more than float32 rounding could bridge, so exact float32 token checks are sound."""
    from conformance.models import get_model

    eager = get_model(model).build(torch.float32, "cpu")
    tokens = eager_tokens(model, eager)
    logits = float64_path_logits(model, eager, tokens)
    top2 = logits.topk(2, dim=-1).values
    gaps = top2[..., 0] - top2[..., 1]
    bounds = NEAR_TIE_FACTOR * MODEL_TOLERANCES[torch.float32] * logits.norm(dim=-1)
    if not torch.equal(logits.argmax(dim=-1), tokens):
        fail(SELF_CHECK, f"{model} float32 path", "float64 argmax disagrees with eager float32's path")
    if bool((gaps <= bounds).any()):
        fail(SELF_CHECK, f"{model} float32 path", f"a near-tie: gaps {gaps.tolist()}, bounds {bounds}")


# ====================================================================================== data movement


@dataclass
class Measured:
    tokens: torch.Tensor
    stats: CallStats

    def total(self, key: str) -> int:
        return sum(s.get(key, 0) for _, s in self.stats)


def measure(
    backend: RuntimeBackend, value: str, pipeline: Callable[[CallStats | None], torch.Tensor]
) -> Measured:
    """With the skip option at ``value``: one run, with its per-execute stats."""
    with option(backend, SKIP, value):
        stats: CallStats = []
        tokens = pipeline(stats)
    return Measured(tokens, stats)


def record_measured(request: pytest.FixtureRequest, plain: Measured, kept: Measured) -> None:
    record(
        request,
        d2h_bytes_skip=kept.total("d2h_bytes"),
        h2d_bytes_skip=kept.total("h2d_bytes"),
        d2h_bytes_noskip=plain.total("d2h_bytes"),
        h2d_bytes_noskip=plain.total("h2d_bytes"),
    )


#: Without skip-copy each counter is judged on its own rule: a wrong ``d2h_bytes`` is not an H2D bug.
COUNTER_RULES: dict[str, str] = {"h2d_bytes": H2D_BYTES, "d2h_bytes": D2H_BYTES}


def check_rows(
    call: str, rows: CallStats, want: list[tuple[str, dict[str, int]]], rule: str | Mapping[str, str]
) -> None:
    """Per-execute stats, in call order, against the expected (method, {counter: bytes}) rows. ``rule``:
    one rule id for every counter, or one per counter (:data:`COUNTER_RULES`)."""

    def rule_for(key: str) -> str:
        return rule if isinstance(rule, str) else rule[key]

    if [m for m, _ in rows] != [m for m, _ in want]:
        fail(rule_for("h2d_bytes"), call, f"executes {[m for m, _ in rows]}, expected {[m for m, _ in want]}")
    for index, ((method, got), (_, expected)) in enumerate(zip(rows, want, strict=True)):
        for key, value in expected.items():
            if got.get(key) != value:
                why = f"execute #{index} ({method}): {key} = {got.get(key)}, want {value}"
                fail(rule_for(key), call, why)


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def output_bytes(lm: LoweredModel, method: str) -> int:
    """Bytes of ``method``'s outputs on its example inputs, from eager: the pipeline calls it with inputs
    of those shapes, so a copying execute moves exactly this many bytes to the host."""
    module, inputs = lm.eager[method]
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        result = module(*inputs)
    return sum(nbytes(t) for t in (result if isinstance(result, (tuple, list)) else (result,)))


def copied_and_kept(
    request: pytest.FixtureRequest,
    backend: RuntimeBackend,
    model: str,
    lm: LoweredModel,
    skip: str,
    call: str,
) -> tuple[Measured, Measured]:
    """The pipeline measured without skip-copy and with ``skip``; figures recorded; tokens must agree."""
    with handles(backend, lm.program, *METHODS[model]) as made:

        def pipeline(stats: CallStats | None) -> torch.Tensor:
            return run_pipeline(backend, model, lm.eager, made, stats)

        plain = measure(backend, "", pipeline)
        kept = measure(backend, skip, pipeline)
    record_measured(request, plain, kept)
    if not torch.equal(kept.tokens, plain.tokens):
        fail(
            SKIP_INVARIANT,
            call,
            f"tokens {kept.tokens.tolist()} with skip, {plain.tokens.tolist()}",
        )
    return plain, kept


@pytest.mark.rules(LOWER, SKIP_INVARIANT, KV_CACHE_ON_DEVICE, H2D_BYTES, D2H_BYTES)
@pytest.mark.gpu
@pytest.mark.parametrize("model", pipeline_params("llm"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_llm_kv_cache_stays_on_gpu(
    runtime: LoweringRuntimeBackend, dtype: str, model: str, request: pytest.FixtureRequest
) -> None:
    """multi_method/kv-cache-on-device: with prefill and decode both skipped, no execute copies anything to
    the host and each decode step uploads only its token and position; tokens are those of the copying
    run. Without skip, the caches make the round trip every step (and are counted)."""
    backend = runtime
    require_part(backend, "runtime_options")  # skip-copy here is the runtime option's
    lm = lower_or_fail(backend, model, dtype, "cuda")
    prefill, decode = METHODS[model]
    call = f"{model} pipeline ({dtype}, cuda, {STEPS[model]} steps)"
    prompt = host_inputs(lm.eager, prefill)[0]
    batch = prompt.shape[0]
    cache_bytes = sum(nbytes(t) for t in lm.eager[decode][1][2:])
    step_bytes = batch * INT64_BYTES + INT64_BYTES  # token [B, 1] and position [1], int64
    plain, kept = copied_and_kept(request, backend, model, lm, f"{prefill},{decode}", call)
    decodes = STEPS[model] - 1
    want = [(prefill, {"d2h_bytes": 0, "h2d_bytes": nbytes(prompt)})]
    want += [(decode, {"d2h_bytes": 0, "h2d_bytes": step_bytes})] * decodes
    check_rows(call + f" with skip-copy on {prefill},{decode}", kept.stats, want, KV_CACHE_ON_DEVICE)
    want = [(prefill, {"h2d_bytes": nbytes(prompt), "d2h_bytes": output_bytes(lm, prefill)})]
    step = {"h2d_bytes": step_bytes + cache_bytes, "d2h_bytes": output_bytes(lm, decode)}
    want += [(decode, step)] * decodes
    check_rows(call + " without skip-copy", plain.stats, want, COUNTER_RULES)


@pytest.mark.rules(LOWER, SKIP_INVARIANT, DEVICE_INPUT, H2D_BYTES, D2H_BYTES)
@pytest.mark.gpu
@pytest.mark.parametrize("model", pipeline_params("asr"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_asr_decoder_consumes_encoder_output_on_gpu(
    runtime: LoweringRuntimeBackend, dtype: str, model: str, request: pytest.FixtureRequest
) -> None:
    """multi_method/device-input: with ``encoder`` skipped, its output stays on the GPU and every decoder
    step uploads only the token ids, not the hidden states; the decoder's logits are still copied out as
    without skip; tokens are those of the copying run."""
    backend = runtime
    require_part(backend, "runtime_options")  # skip-copy here is the runtime option's
    lm = lower_or_fail(backend, model, dtype, "cuda")
    encoder, decoder = METHODS[model]
    steps = STEPS[model]
    call = f"{model} pipeline ({dtype}, cuda, {steps} steps)"
    features = host_inputs(lm.eager, encoder)[0]
    batch = features.shape[0]
    hidden_bytes = nbytes(lm.eager[decoder][1][1])  # the example hidden states: the encoder's output shape
    plain, kept = copied_and_kept(request, backend, model, lm, encoder, call)
    tokens_bytes = [batch * (step + 1) * INT64_BYTES for step in range(steps)]
    logits_bytes = [s.get("d2h_bytes") for m, s in plain.stats if m == decoder]
    want = [(encoder, {"d2h_bytes": 0, "h2d_bytes": nbytes(features)})]
    want += [
        (decoder, {"h2d_bytes": t, "d2h_bytes": d}) for t, d in zip(tokens_bytes, logits_bytes, strict=False)
    ]
    check_rows(call + f" with skip-copy on {encoder}", kept.stats, want, DEVICE_INPUT)
    want = [(encoder, {"d2h_bytes": hidden_bytes, "h2d_bytes": nbytes(features)})]
    want += [(decoder, {"h2d_bytes": t + hidden_bytes}) for t in tokens_bytes]
    check_rows(call + " without skip-copy", plain.stats, want, COUNTER_RULES)
    if any(not d for d in logits_bytes):
        fail(D2H_BYTES, call, f"decoder logits copied to the host count {logits_bytes} bytes")
