"""Chapter mm_out — the cuBLAS shim ``mm_out(out, self, mat2)``, out = self @ mat2 (SPEC §1c).

Every check names its rule as ``mm_out/<rule>``; the protocol is in ``conformance/protocol.py``.
"""

from __future__ import annotations

import contextlib
import threading
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import pytest
import torch

from conformance.common.checks import (
    assert_exact,
    assert_matmul_close,
    assert_raises_invalid_argument,
    assert_untouched,
    coverage_gap,
    fail,
    snapshot,
)
from conformance.common.declared_rules import params
from conformance.common.parts import part_fixture
from conformance.common.rules import family_ids, rule_id
from conformance.common.tolerances import DTYPES_BY_NAME
from conformance.protocol import MmOutBackend

if TYPE_CHECKING:
    from conformance.common.parts import LoweringRuntimeBackend

DTYPES = list(DTYPES_BY_NAME)

# The rules of this chapter (conformance/catalogue/rule_table.py); the bad inputs': BAD_INPUT_RULES.
VALUES = rule_id("mm_out/values")
EXACT_ONES = rule_id("mm_out/exact-ones")
EXACT_IDENTITY = rule_id("mm_out/exact-identity")
EXACT_INTEGERS = rule_id("mm_out/exact-integers")
NO_TF32 = rule_id("mm_out/no-tf32")
ZERO_SIZE = rule_id("mm_out/zero-size")
CURRENT_STREAM = rule_id("mm_out/current-stream")
NO_HOST_SYNC = rule_id("mm_out/no-host-sync")
THREADS = rule_id("mm_out/threads")
ON_TENSORS_DEVICE = rule_id("mm_out/device")
ARITY = rule_id("mm_out/arity")
SAME_DEVICE = rule_id("mm_out/same-device")
CUDA_DEVICE = rule_id("mm_out/cuda-device")
PROGRAM_ROUTE = rule_id("mm_out/program-route")

# (M, K, N): edge sizes, odd and prime sizes, one large square. out is [M, N].
SHAPES: dict[str, tuple[int, int, int]] = {
    "1x1x1": (1, 1, 1),
    "single-row-M1": (1, 64, 48),
    "K1": (64, 1, 48),
    "single-col-N1": (64, 48, 1),
    "odd-33x17x9": (33, 17, 9),
    "primes-257x129x65": (257, 129, 65),
    "medium-128x256x64": (128, 256, 64),
}
LARGE_SHAPE = (4096, 4096, 4096)
# How each operand is laid out in memory: row-major, column-major (a transposed view, as F.linear's W.t()),
# or strided (every other column of a wider tensor: neither layout, so it needs a copy).
LAYOUTS = ["row", "col", "strided"]
LAYOUT_PAIRS = [(a, b) for a in LAYOUTS for b in LAYOUTS]
LAYOUT_IDS = [f"{a}-{b}" for a, b in LAYOUT_PAIRS]


# Cases annotate it ``MmOutBackend``; the implementation is reported first, whatever the backend lacks.
mm = part_fixture("mm_out", first=("mm_out_path",), doc="The backend, for cases of part ``mm_out``.")


@pytest.fixture(scope="module")
def mm_out_path(request: pytest.FixtureRequest, backend: MmOutBackend) -> str:
    """Which implementation runs behind ``mm_out`` (optional protocol attribute ``mm_out_path``): said once
    on the terminal and stored in the result file's run metadata (``mm_out_path``)."""
    describe = getattr(backend, "mm_out_path", None)
    text = str(describe()) if callable(describe) else f"{backend.name} does not say (no mm_out_path)"
    config = request.config
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None:
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            reporter.write_line(f"mm_out: {text}")
    if config.pluginmanager.hasplugin("harness.pytest_plugin"):
        from harness.pytest_plugin import add_run_metadata

        add_run_metadata(config, "mm_out_path", text)
    return text


def generator(case: str, device: torch.device) -> torch.Generator:
    """A generator seeded from the case name: reproducible, and different per case."""
    return torch.Generator(device=device).manual_seed(zlib.crc32(case.encode()))


def make_operand(
    rows: int, cols: int, layout: str, dtype: torch.dtype, gen: torch.Generator, device: torch.device
) -> torch.Tensor:
    """A [rows, cols] tensor of random normal values with the requested memory layout."""
    if layout == "row":
        return torch.randn(rows, cols, generator=gen, device=device).to(dtype)
    if layout == "col":
        return torch.randn(cols, rows, generator=gen, device=device).to(dtype).t()
    if layout == "strided":
        return torch.randn(rows, 2 * cols, generator=gen, device=device).to(dtype)[:, ::2]
    raise ValueError(layout)


def poisoned_out(m: int, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """out pre-filled with NaN: a correct mm_out never reads it, and leaves no NaN behind."""
    return torch.full((m, n), float("nan"), dtype=dtype, device=device)


def call_text(out: torch.Tensor | None, a: torch.Tensor | None, b: torch.Tensor | None) -> str:
    def describe(t: torch.Tensor | None) -> str:
        if not isinstance(t, torch.Tensor):
            return repr(t)
        dtype = str(t.dtype).removeprefix("torch.")
        return f"{dtype}{list(t.shape)} stride={t.stride()} on {t.device}"

    return f"mm_out(out={describe(out)}, self={describe(a)}, mat2={describe(b)})"


CUDA = torch.device("cuda")


def check_values(
    mm: MmOutBackend, dtype: str, shape: tuple[int, int, int], layout_self: str, layout_mat2: str, seed: str
) -> None:
    """Random operands in the given layouts, out poisoned with NaN, result against float64."""
    m, k, n = shape
    dt = DTYPES_BY_NAME[dtype]
    gen = generator(seed, CUDA)
    a = make_operand(m, k, layout_self, dt, gen, CUDA)
    b = make_operand(k, n, layout_mat2, dt, gen, CUDA)
    out = poisoned_out(m, n, dt, CUDA)
    mm.mm_out(out, a, b)
    torch.cuda.synchronize()
    assert_matmul_close(VALUES, call_text(out, a, b), out, a, b)


# ---------------------------------------------------------------------------------------------- values


@pytest.mark.rules(VALUES)
@pytest.mark.gpu
@pytest.mark.parametrize(("layout_self", "layout_mat2"), LAYOUT_PAIRS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("shape", list(SHAPES.values()), ids=list(SHAPES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_values_match_float64_reference(
    mm: MmOutBackend, dtype: str, shape: tuple[int, int, int], layout_self: str, layout_mat2: str
) -> None:
    """mm_out/values: out ≈ self @ mat2 within the dtype's tolerance, for every layout; out never read."""
    check_values(
        mm, dtype, shape, layout_self, layout_mat2, seed=f"{dtype}-{shape}-{layout_self}-{layout_mat2}"
    )


@pytest.mark.rules(VALUES)
@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize(("layout_self", "layout_mat2"), LAYOUT_PAIRS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_large_4096_cubed(mm: MmOutBackend, dtype: str, layout_self: str, layout_mat2: str) -> None:
    """mm_out/values, large: 4096³ within tolerance (tiles, split-K and workspace paths)."""
    check_values(
        mm, dtype, LARGE_SHAPE, layout_self, layout_mat2, seed=f"large-{dtype}-{layout_self}-{layout_mat2}"
    )


@pytest.mark.rules(EXACT_ONES)
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_ones_is_exactly_2048(mm: MmOutBackend, dtype: str, layout: str) -> None:
    """mm_out/exact-ones: ones[1, 2048] @ ones[2048, 256] is exactly 2048 in every dtype."""
    dt = DTYPES_BY_NAME[dtype]
    a = torch.ones(1, 2048, dtype=dt, device=CUDA)
    b = torch.ones(2048, 256, dtype=dt, device=CUDA)
    if layout == "col":
        b = torch.ones(256, 2048, dtype=dt, device=CUDA).t()
    out = poisoned_out(1, 256, dt, CUDA)
    mm.mm_out(out, a, b)
    torch.cuda.synchronize()
    assert_exact(EXACT_ONES, call_text(out, a, b), out, torch.full_like(out, 2048))


@pytest.mark.rules(EXACT_IDENTITY)
@pytest.mark.gpu
@pytest.mark.parametrize("n", [64, 257])
@pytest.mark.parametrize("dtype", DTYPES)
def test_identity_times_diagonal_is_exact(mm: MmOutBackend, dtype: str, n: int) -> None:
    """mm_out/exact-identity: I @ diag(d) == diag(d) bit for bit (each element is one product)."""
    dt = DTYPES_BY_NAME[dtype]
    d = torch.randn(n, generator=generator(f"diag-{dtype}-{n}", CUDA), device=CUDA).to(dt)
    a = torch.eye(n, dtype=dt, device=CUDA)
    b = torch.diag(d)
    out = poisoned_out(n, n, dt, CUDA)
    mm.mm_out(out, a, b)
    torch.cuda.synchronize()
    assert_exact(EXACT_IDENTITY, call_text(out, a, b), out, b)


@pytest.mark.rules(EXACT_INTEGERS)
@pytest.mark.gpu
@pytest.mark.parametrize(("layout_self", "layout_mat2"), LAYOUT_PAIRS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_small_integers_are_exact(mm: MmOutBackend, dtype: str, layout_self: str, layout_mat2: str) -> None:
    """mm_out/exact-integers: entries in {-1, 0, 1}, K=128: every partial sum is an exact small integer."""
    dt = DTYPES_BY_NAME[dtype]
    gen = generator(f"ints-{dtype}-{layout_self}-{layout_mat2}", CUDA)
    m, k, n = 257, 128, 65
    a = make_operand(m, k, layout_self, torch.float32, gen, CUDA).sign().to(dt)
    b = make_operand(k, n, layout_mat2, torch.float32, gen, CUDA).sign().to(dt)
    a = a * (torch.rand(a.shape, generator=gen, device=CUDA) > 0.3).to(dt)  # some zeros, not all
    out = poisoned_out(m, n, dt, CUDA)
    mm.mm_out(out, a, b)
    torch.cuda.synchronize()
    assert_exact(EXACT_INTEGERS, call_text(out, a, b), out, (a.double() @ b.double()).to(dt))


@pytest.mark.rules(NO_TF32)
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["row", "col"])
def test_float32_does_not_use_tf32(mm: MmOutBackend, layout: str) -> None:
    """mm_out/no-tf32: float32 keeps all 24 mantissa bits. (1 + 2⁻¹²)·256 = 256.0625 exactly in float32;
    TF32 inputs (10-bit mantissa) round 1 + 2⁻¹² to 1 and give 256."""
    a = torch.full((128, 256), 1 + 2**-12, dtype=torch.float32, device=CUDA)
    b = torch.ones(256, 128, dtype=torch.float32, device=CUDA)
    if layout == "col":
        a = a.t().contiguous().t()
    out = poisoned_out(128, 128, torch.float32, CUDA)
    mm.mm_out(out, a, b)
    torch.cuda.synchronize()
    assert_exact(NO_TF32, call_text(out, a, b), out, torch.full_like(out, 256.0625))


@pytest.mark.rules(ZERO_SIZE)
@pytest.mark.gpu
@pytest.mark.parametrize(
    ("m", "k", "n"), [(0, 16, 8), (8, 16, 0), (8, 0, 16), (0, 0, 0)], ids=["M0", "N0", "K0", "all0"]
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_sizes_follow_torch_mm(mm: MmOutBackend, dtype: str, m: int, k: int, n: int) -> None:
    """mm_out/zero-size: empty M or N is a no-op; K = 0 gives zeros (torch.mm's semantics)."""
    dt = DTYPES_BY_NAME[dtype]
    gen = generator(f"zero-{dtype}-{m}x{k}x{n}", CUDA)
    a = torch.randn(m, k, generator=gen, device=CUDA).to(dt)
    b = torch.randn(k, n, generator=gen, device=CUDA).to(dt)
    out = poisoned_out(m, n, dt, CUDA)
    mm.mm_out(out, a, b)
    torch.cuda.synchronize()
    assert_exact(ZERO_SIZE, call_text(out, a, b), out, torch.mm(a, b))


# --------------------------------------------------------------------------------------- streams, threads


def _warm_up(mm: MmOutBackend, device: torch.device) -> None:
    """Calls first, so library loading, handle creation and the lazy loading of the GEMM kernel (CUDA loads
    a kernel at its first launch, which can wait for the device) are not mistaken for a host sync: one
    small call, and one of exactly the ordering cases' shapes and dtype (``_busy_stream_inputs``)."""
    out, a, b = _valid(device)
    mm.mm_out(out, a, b)
    gen = generator(f"warm-up-{device}", device)
    a = torch.randint(-3, 4, (192, 160), generator=gen, device=device).float()
    b = torch.randint(-3, 4, (160, 96), generator=gen, device=device).float()
    mm.mm_out(poisoned_out(192, 96, torch.float32, device), a, b)
    torch.cuda.synchronize(device)


def _busy_stream_inputs(
    stream: torch.cuda.Stream, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs whose final values are written on ``stream`` only after a long busy kernel.

    Whoever reads them from another stream, or before the busy kernel ends, reads NaN.
    """
    gen = generator(f"ordering-{device}", device)
    a_src = torch.randint(-3, 4, (192, 160), generator=gen, device=device).float()
    b = torch.randint(-3, 4, (160, 96), generator=gen, device=device).float()
    expected = a_src.double() @ b.double()
    torch.cuda.synchronize(device)
    with torch.cuda.stream(stream):
        a = torch.full_like(a_src, float("nan"))
        torch.cuda._sleep(1_000_000_000)  # ~0.5 s of spinning on the stream
        a.copy_(a_src)
    # a_src was allocated on another stream and is read on `stream` later: without this, freeing it on
    # return would let the caching allocator hand its memory to the next allocation before the copy ran.
    a_src.record_stream(stream)
    b.record_stream(stream)
    return a, b, expected.float()


@pytest.mark.rules(CURRENT_STREAM, NO_HOST_SYNC)
@pytest.mark.gpu
def test_runs_on_callers_current_stream(mm: MmOutBackend) -> None:
    """mm_out/current-stream: the product is ordered after earlier work on the caller's current stream,
    and the call returns without waiting for that stream (it only enqueues)."""
    stream = torch.cuda.Stream()
    # Warm up on this very stream: a first use's setup there (a backend's own stream, a per-stream handle
    # or workspace allocation, which may synchronise the device) must not hide an ordering bug below.
    with torch.cuda.stream(stream):
        _warm_up(mm, CUDA)
    a, b, expected = _busy_stream_inputs(stream, CUDA)
    out = poisoned_out(192, 96, torch.float32, CUDA)
    with torch.cuda.stream(stream):
        mm.mm_out(out, a, b)
        still_busy = not stream.query()
    stream.synchronize()
    assert_exact(CURRENT_STREAM, call_text(out, a, b), out, expected)
    if not still_busy:
        fail(
            NO_HOST_SYNC,
            call_text(out, a, b),
            "returned only after the caller's stream drained; it must enqueue on it and return",
        )


def _thread_case(i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-thread inputs with exact integer products, shapes differing by thread so mix-ups show."""
    gen = generator(f"thread-{i}", CUDA)
    m, k, n = 64 + 8 * i, 96, 48 + 4 * i
    a = torch.randint(-2, 3, (m, k), generator=gen, device=CUDA).float()
    b = torch.randint(-2, 3, (k, n), generator=gen, device=CUDA).float()
    return a, b, (a.double() @ b.double()).float()


@pytest.mark.rules(THREADS)
@pytest.mark.gpu
@pytest.mark.parametrize("streams", ["own-streams", "shared-stream"])
def test_threads_match_serial(mm: MmOutBackend, streams: str) -> None:
    """mm_out/threads: 8 threads × 200 calls, each result equal to the serial result; no deadlock."""
    threads, calls, timeout_s = 8, 200, 120.0
    cases = [_thread_case(i) for i in range(threads)]
    serial = []
    for a, b, _ in cases:
        out = poisoned_out(a.shape[0], b.shape[1], torch.float32, CUDA)
        mm.mm_out(out, a, b)
        serial.append(out)
    torch.cuda.synchronize()
    for (a, b, expected), out in zip(cases, serial, strict=True):
        assert_exact(THREADS, f"serial {call_text(out, a, b)}", out, expected)
    shared = torch.cuda.Stream()
    errors: list[str] = []
    mismatches = [0] * threads

    def worker(i: int) -> None:
        a, b, _ = cases[i]
        stream = shared if streams == "shared-stream" else torch.cuda.Stream()
        try:
            with torch.cuda.stream(stream):
                out = torch.empty_like(serial[i])
                for _ in range(calls):
                    out.fill_(float("nan"))
                    mm.mm_out(out, a, b)
                    if not torch.equal(out, serial[i]):  # syncs this stream only
                        mismatches[i] += 1
        except Exception as exc:  # reported below with the thread index
            errors.append(f"thread {i}: {type(exc).__name__}: {exc}")

    pool = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout_s)
    call = f"{threads} threads × {calls} calls of mm_out on {streams}"
    if any(t.is_alive() for t in pool):
        fail(THREADS, call, f"threads still running after {timeout_s:.0f} s: deadlock or livelock")
    if errors:
        fail(THREADS, call, "; ".join(errors))
    if any(mismatches):
        fail(THREADS, call, f"results differ from the serial result (per thread: {mismatches})")


@pytest.mark.rules(ON_TENSORS_DEVICE)
@pytest.mark.gpu
@pytest.mark.multi_gpu
def test_device1_call_runs_on_device1(mm: MmOutBackend) -> None:
    """mm_out/device: tensors on cuda:1 while cuda:0 is current → computed on device 1, on device 1's
    current stream (a handle or stream of device 0 would fail or read unfinished inputs)."""
    dev1 = torch.device("cuda", 1)
    torch.cuda.set_device(0)
    _warm_up(mm, dev1)
    stream1 = torch.cuda.Stream(device=dev1)
    a, b, expected = _busy_stream_inputs(stream1, dev1)
    out = poisoned_out(192, 96, torch.float32, dev1)
    torch.cuda.set_stream(stream1)  # device 1's current stream is stream1 ...
    torch.cuda.set_device(0)  # ... while device 0 is the current device
    try:
        mm.mm_out(out, a, b)
        current_after = torch.cuda.current_device()
    finally:
        torch.cuda.set_stream(torch.cuda.default_stream(dev1))
        torch.cuda.set_device(0)
    stream1.synchronize()
    assert_exact(ON_TENSORS_DEVICE, call_text(out, a, b), out, expected)
    if current_after != 0:
        fail(ON_TENSORS_DEVICE, call_text(out, a, b), f"left the current device at {current_after}, not 0")


# -------------------------------------------------------------------------------------------- bad inputs
# Each case breaks exactly one rule; the error must name the argument and the rule, and out stays untouched.

Builder = Callable[[torch.device], tuple]


def _valid(device: torch.device, dtype: torch.dtype = torch.float32) -> tuple:
    gen = generator(f"valid-{device}", device)
    a = torch.randn(6, 5, generator=gen, device=device).to(dtype)
    b = torch.randn(5, 4, generator=gen, device=device).to(dtype)
    return torch.full((6, 4), float("nan"), device=device).to(dtype), a, b


def _replace(index: int, make: Callable[[tuple], object]) -> Builder:
    def build(device: torch.device) -> tuple:
        args = list(_valid(device))
        args[index] = make(tuple(args))
        return tuple(args)

    return build


# rule id → (argument blamed, keywords the message must contain one of, builder of (out, self, mat2))
BAD_INPUTS: dict[str, tuple[str, tuple[str, ...], Builder]] = {
    "none-out": ("out", ("none", "missing", "required"), _replace(0, lambda a: None)),
    "none-self": ("self", ("none", "missing", "required"), _replace(1, lambda a: None)),
    "none-mat2": ("mat2", ("none", "missing", "required"), _replace(2, lambda a: None)),
    "rank-self-3d": ("self", ("rank", "dim", "2-d", "2d", "matrix"), _replace(1, lambda a: a[1][None])),
    "rank-mat2-1d": ("mat2", ("rank", "dim", "2-d", "2d", "matrix"), _replace(2, lambda a: a[2][:, 0])),
    "rank-out-3d": ("out", ("rank", "dim", "2-d", "2d", "shape"), _replace(0, lambda a: a[0][None])),
    "inner-dimension": ("mat2", ("inner", "size", "dimension", "shape"), _replace(2, lambda a: a[2][:4])),
    "out-shape": ("out", ("shape", "size"), _replace(0, lambda a: torch.empty_like(a[0][:, :3]).fill_(1.5))),
    "out-shape-transposed": ("out", ("shape", "size"), _replace(0, lambda a: a[0].new_full((4, 6), 2.5))),
    "out-not-contiguous": (
        "out",
        ("contiguous", "row-major", "stride"),
        _replace(0, lambda a: a[0].new_full((4, 6), 3.5).t()),
    ),
    "out-strided": (
        "out",
        ("contiguous", "row-major", "stride"),
        _replace(0, lambda a: a[0].new_full((6, 8), 4.5)[:, ::2]),
    ),
    "dtype-mismatch-mat2": ("mat2", ("dtype",), _replace(2, lambda a: a[2].half())),
    "dtype-mismatch-out": ("out", ("dtype",), _replace(0, lambda a: a[0].to(torch.bfloat16))),
    "unsupported-dtype-float64": (
        "self",
        ("dtype", "float64", "double"),
        lambda d: tuple(t.double() for t in _valid(d)),
    ),
    "unsupported-dtype-int32": (
        "self",
        ("dtype", "int"),
        lambda d: (
            torch.full((6, 4), 7, dtype=torch.int32, device=d),
            *((t * 4).int() for t in _valid(d)[1:]),
        ),
    ),
    "cpu-out": ("out", ("cuda", "device", "cpu"), _replace(0, lambda a: a[0].cpu())),
    "cpu-self": ("self", ("cuda", "device", "cpu"), _replace(1, lambda a: a[1].cpu())),
    "cpu-mat2": ("mat2", ("cuda", "device", "cpu"), _replace(2, lambda a: a[2].cpu())),
}
BAD_INPUT_RULES = family_ids("mm_out/{bad_input}", BAD_INPUTS)


@pytest.mark.gpu
@pytest.mark.parametrize("rule", params(BAD_INPUT_RULES))
def test_bad_input_is_rejected_and_out_untouched(mm: MmOutBackend, rule: str) -> None:
    """mm_out/<rule>: a contract violation raises an invalid-argument error naming the argument and the
    rule, and leaves out exactly as it was."""
    argument, keywords, build = BAD_INPUTS[rule]
    out, a, b = build(CUDA)
    before = snapshot(out) if isinstance(out, torch.Tensor) else None
    call = call_text(out, a, b)
    assert_raises_invalid_argument(
        BAD_INPUT_RULES[rule], call, lambda: mm.mm_out(out, a, b), argument=argument, keywords=keywords
    )
    torch.cuda.synchronize()
    if before is not None:
        assert_untouched(BAD_INPUT_RULES[rule], call, "out", before, out)


@pytest.mark.rules(ARITY)
@pytest.mark.gpu
def test_missing_argument_is_a_call_error(mm: MmOutBackend) -> None:
    """mm_out/arity: two arguments is Python's TypeError naming the missing one; out untouched."""
    out, a, _ = _valid(CUDA)
    before = snapshot(out)
    untyped: Callable[..., object] = mm.mm_out  # called with an argument missing, on purpose
    assert_raises_invalid_argument(
        ARITY,
        "mm_out(out, self)",
        lambda: untyped(out, a),
        argument="mat2",
        keywords=("missing", "required", "argument"),
        exception=(TypeError, ValueError),
    )
    assert_untouched(ARITY, "mm_out(out, self)", "out", before, out)


@pytest.mark.rules(SAME_DEVICE)
@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.parametrize("moved", ["out", "self", "mat2"])
def test_tensors_on_different_devices_are_rejected(mm: MmOutBackend, moved: str) -> None:
    """mm_out/same-device: one tensor on cuda:1, the others on cuda:0 → invalid argument; out untouched."""
    out, a, b = _valid(CUDA)
    args = {"out": out, "self": a, "mat2": b}
    args[moved] = args[moved].to("cuda:1")
    before = snapshot(args["out"])
    call = call_text(args["out"], args["self"], args["mat2"])
    assert_raises_invalid_argument(
        SAME_DEVICE,
        call,
        lambda: mm.mm_out(args["out"], args["self"], args["mat2"]),
        argument=moved,
        keywords=("device", "cuda:"),
    )
    assert_untouched(SAME_DEVICE, call, "out", before, args["out"])


@pytest.mark.rules(CUDA_DEVICE)
def test_cpu_tensors_are_rejected(mm: MmOutBackend) -> None:
    """mm_out/cuda-device: valid shapes and dtypes but all on the CPU → invalid argument naming a CPU
    tensor; out untouched. Runs without a GPU: upstream's shim never checked the device type."""
    out, a, b = _valid(torch.device("cpu"))
    before = snapshot(out)
    call = call_text(out, a, b)
    exc = assert_raises_invalid_argument(
        CUDA_DEVICE,
        call,
        lambda: mm.mm_out(out, a, b),
        argument="",  # any of the three may be named first; the keyword check below names the rule
        keywords=("cuda", "device", "cpu"),
    )
    if not any(name in str(exc) for name in ("out", "self", "mat2")):
        fail(CUDA_DEVICE, call, f"the error must name the CPU argument; it said: {exc}")
    assert_untouched(CUDA_DEVICE, call, "out", before, out)


# ------------------------------------------------------------------------------- compiled programs call it


@pytest.mark.rules(PROGRAM_ROUTE)
@pytest.mark.gpu
@pytest.mark.parametrize("method", ["prefill", "decode"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_compiled_program_calls_backend_mm_out(mm: MmOutBackend, dtype: str, method: str) -> None:
    """mm_out/program-route: executing a lowered LLM method moves the backend's own mm_out call counter by
    exactly the number of mm_out calls its compiled code makes, every execute (optional protocol attributes
    ``mm_out_calls`` / ``mm_out_calls_per_execute``; without them: a skip, never a failure)."""
    from conformance.common.programs import handles, lower_or_fail

    calls = getattr(mm, "mm_out_calls", None)
    per_execute = getattr(mm, "mm_out_calls_per_execute", None)
    if not (callable(calls) and callable(per_execute)):
        pytest.skip(
            f"backend {mm.name!r} exposes no mm_out call counter (mm_out_calls, mm_out_calls_per_execute)"
        )
    missing = [a for a in ("lower", "init", "execute", "destroy") if not callable(getattr(mm, a, None))]
    if missing:
        pytest.skip(f"backend {mm.name!r} cannot lower and run programs (lacks {missing})")
    runner = cast("LoweringRuntimeBackend", mm)  # the parts' calls this case makes: checked just above
    lowered = lower_or_fail(runner, "llm", dtype, "cuda")
    _, inputs = lowered.eager[method]
    call = f"execute(llm.{method}, {dtype}) on cuda"
    with handles(runner, lowered.program, method) as (handle,):
        expected = per_execute(handle)
        if expected is None:
            coverage_gap(
                PROGRAM_ROUTE,
                call,
                "the compiled program calls another mm_out (e.g. libtorch's), not the backend's",
            )
        if expected == 0:
            pytest.skip(f"the compiled llm.{method} ({dtype}) makes no mm_out calls (inductor chose others)")
        runner.execute(handle, list(inputs))  # warm-up: loads, first launches
        deltas = []
        for _ in range(3):
            before = calls()
            runner.execute(handle, list(inputs))
            after = calls()
            deltas.append(None if before is None or after is None else after - before)
    if any(delta != expected for delta in deltas):
        fail(
            PROGRAM_ROUTE,
            call,
            f"the backend's mm_out counter moved by {deltas} over 3 executes; the compiled code makes "
            f"{expected} mm_out call(s) per execute, so each execute must add exactly {expected}",
        )
