"""Self-tests of the reference ``mm_out`` shim: every rule, the error paths, library discovery.

The CPU part reaches every rule except the device ones and proves ``out`` is left bit-identical. The GPU
part (marked ``gpu``) compares with float64 ``torch.mm`` and checks streams, threads and TF32.
"""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from reference_impl.shims import CublasError, CublasNotFoundError, MmOutArgumentError, cublas_library, mm_out
from reference_impl.shims.errors import RULES

# The package exports the function under the module's name, so reach the module through importlib.
mm_out_module = importlib.import_module("reference_impl.shims.mm_out")

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
M, K, N = 3, 4, 5


def filled(*shape: int, dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.Tensor:
    """Random values with NaNs mixed in, so 'untouched' has to mean bit-identical."""
    t = torch.randn(*shape, dtype=torch.float32, device=device).to(dtype)
    t.view(-1)[::3] = float("nan")
    return t


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits of a tensor (NaN-aware equality through torch.equal)."""
    int_type = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.detach().cpu().clone().contiguous().view(int_type)


Args = tuple[object, object, object]  # (out, self, mat2)


def valid(dtype: torch.dtype = torch.float32) -> Args:
    return filled(M, N, dtype=dtype), torch.randn(M, K).to(dtype), torch.randn(K, N).to(dtype)


def replace(args: Args, **kw: object) -> Args:
    out, self_, mat2 = args
    return kw.get("out", out), kw.get("self", self_), kw.get("mat2", mat2)


def _overlapping_out() -> Args:
    buf = torch.randn(64)
    self_ = buf[: M * K].view(M, K)
    out = buf[M * K - 2 : M * K - 2 + M * N].view(M, N)  # its first two elements are self's last two
    return out, self_, torch.randn(K, N)


def _out_inside_transposed_mat2() -> Args:
    buf = torch.randn(64)
    mat2 = buf[: K * N].view(N, K).t()  # column-major mat2 read in place with CUBLAS_OP_T
    return buf[5 : 5 + M * N].view(M, N), torch.randn(M, K), mat2


# (id, builder of (out, self, mat2), argument blamed, rule broken)
CASES: list[tuple[str, Callable[[], Args], str, str]] = [
    ("self-none", lambda: replace(valid(), self=None), "self", "present"),
    ("mat2-none", lambda: replace(valid(), mat2=None), "mat2", "present"),
    ("out-none", lambda: replace(valid(), out=None), "out", "present"),
    ("all-none-blames-self-first", lambda: (None, None, None), "self", "present"),
    ("self-list", lambda: replace(valid(), self=[[1.0] * K] * M), "self", "is-tensor"),
    ("mat2-int", lambda: replace(valid(), mat2=3), "mat2", "is-tensor"),
    ("out-ndarray", lambda: replace(valid(), out=torch.zeros(M, N).numpy()), "out", "is-tensor"),
    ("self-sparse", lambda: replace(valid(), self=torch.randn(M, K).to_sparse()), "self", "strided-layout"),
    ("self-1d", lambda: replace(valid(), self=torch.randn(K)), "self", "rank-2"),
    ("mat2-3d", lambda: replace(valid(), mat2=torch.randn(1, K, N)), "mat2", "rank-2"),
    ("out-0d", lambda: replace(valid(), out=torch.tensor(1.0)), "out", "rank-2"),
    (
        "self-float64",
        lambda: replace(valid(), self=torch.randn(M, K, dtype=torch.float64)),
        "self",
        "supported-dtype",
    ),
    (
        "mat2-int32",
        lambda: replace(valid(), mat2=torch.ones(K, N, dtype=torch.int32)),
        "mat2",
        "supported-dtype",
    ),
    (
        "out-complex",
        lambda: replace(valid(), out=torch.zeros(M, N, dtype=torch.complex64)),
        "out",
        "supported-dtype",
    ),
    (
        "dtype-checked-before-sameness",
        lambda: replace(valid(torch.float16), out=filled(M, N, dtype=torch.float64)),
        "out",
        "supported-dtype",
    ),
    (
        "mat2-differs-from-self",
        lambda: replace(valid(torch.float16), mat2=torch.randn(K, N)),
        "mat2",
        "same-dtype",
    ),
    (
        "out-differs",
        lambda: replace(valid(torch.bfloat16), out=filled(M, N, dtype=torch.float16)),
        "out",
        "same-dtype",
    ),
    ("inner-mismatch", lambda: replace(valid(), mat2=torch.randn(K + 1, N)), "mat2", "inner-dimension"),
    ("out-wrong-rows", lambda: replace(valid(), out=filled(M + 1, N)), "out", "out-shape"),
    ("out-transposed-shape", lambda: replace(valid(), out=filled(N, M)), "out", "out-shape"),
    ("out-column-slice", lambda: replace(valid(), out=filled(M, N + 2)[:, :N]), "out", "out-contiguous"),
    ("out-transposed-view", lambda: replace(valid(), out=filled(N, M).t()), "out", "out-contiguous"),
    ("out-expanded", lambda: replace(valid(), out=filled(1, N).expand(M, N)), "out", "out-contiguous"),
    ("out-overlaps-self", _overlapping_out, "out", "no-overlap"),
    ("out-inside-transposed-mat2", _out_inside_transposed_mat2, "out", "no-overlap"),
    ("out-is-self", lambda: (lambda t: (t, t, torch.randn(M, M)))(filled(M, M)), "out", "no-overlap"),
    ("valid-cpu-tensors", valid, "self", "cuda-device"),
    ("valid-cpu-fp16", lambda: valid(torch.float16), "self", "cuda-device"),
    ("valid-cpu-bf16", lambda: valid(torch.bfloat16), "self", "cuda-device"),
    ("zero-size-cpu", lambda: (filled(0, N), torch.randn(0, K), torch.randn(K, N)), "self", "cuda-device"),
    ("empty-inner-cpu", lambda: (filled(M, N), torch.randn(M, 0), torch.randn(0, N)), "self", "cuda-device"),
    (
        "meta-tensors",
        lambda: (
            torch.empty(M, N, device="meta"),
            torch.empty(M, K, device="meta"),
            torch.empty(K, N, device="meta"),
        ),
        "self",
        "cuda-device",
    ),
]


@pytest.mark.parametrize(("builder", "argument", "rule"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rule_is_enforced_and_out_untouched(
    builder: Callable[[], Args], argument: str, rule: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No rule may need cuBLAS: make any attempt to load it fail loudly.
    monkeypatch.setattr(cublas_library, "load_cublas", _no_cublas)
    out, self_, mat2 = builder()
    before = bits(out) if isinstance(out, torch.Tensor) and out.device.type != "meta" else None
    with pytest.raises(MmOutArgumentError) as info:
        mm_out(out, self_, mat2)  # type: ignore[arg-type]
    err = info.value
    assert (err.argument, err.rule) == (argument, rule), str(err)
    assert isinstance(err, ValueError)
    assert str(err).startswith(f"mm_out: argument '{argument}' breaks rule '{rule}': ")
    assert rule in RULES
    if before is not None:
        assert torch.equal(bits(out), before), "out was modified"  # type: ignore[arg-type]


def _no_cublas(*_: object) -> None:
    raise AssertionError("validation must not load cuBLAS")


def test_message_matches_the_documented_format() -> None:
    out, self_, _ = valid(torch.float16)
    with pytest.raises(MmOutArgumentError) as info:
        mm_out(out, self_, torch.randn(K, N))  # type: ignore[arg-type]
    assert str(info.value) == (
        "mm_out: argument 'mat2' breaks rule 'same-dtype': "
        "mat2 has dtype torch.float32 but self has torch.float16"
    )


def test_rules_are_checked_in_the_documented_order() -> None:
    """Several broken rules at once: the first in RULES order is reported."""
    with pytest.raises(MmOutArgumentError) as info:  # rank-2 (out) comes before supported-dtype (self)
        mm_out(filled(M), torch.randn(M, K, dtype=torch.float64), torch.randn(K, N))
    assert (info.value.argument, info.value.rule) == ("out", "rank-2")
    with pytest.raises(MmOutArgumentError) as info:  # out-shape comes before cuda-device
        mm_out(filled(N, M), torch.randn(M, K), torch.randn(K, N))
    assert info.value.rule == "out-shape"
    assert list(RULES)[:3] == ["present", "is-tensor", "strided-layout"]


@pytest.mark.parametrize(
    ("shapes", "argument", "what"),
    [
        (((2**31, 1), (2**31, 1), (1, 1)), "self", "self.size(0) (M)"),
        (((1, 2**31), (1, 1), (1, 2**31)), "mat2", "mat2.size(1) (N)"),
        (((1, 1), (1, 2**31), (2**31, 1)), "self", "self.size(1) (K)"),
    ],
)
def test_sizes_past_int32_are_rejected_not_truncated(
    shapes: tuple[tuple[int, int], ...], argument: str, what: str
) -> None:
    # Meta tensors have shapes but no memory, so a 2**31-row problem costs nothing to build.
    out_shape, self_shape, mat2_shape = shapes
    out = torch.empty(out_shape, device="meta")
    self_ = torch.empty(1, 1, device="meta").expand(self_shape)
    mat2 = torch.empty(1, 1, device="meta").expand(mat2_shape)
    with pytest.raises(MmOutArgumentError) as info:
        mm_out(out, self_, mat2)
    assert (info.value.argument, info.value.rule) == (argument, "size-limit")
    assert what in str(info.value)


def test_out_in_the_gaps_of_self_is_not_an_overlap() -> None:
    """The overlap rule is exact: out may live between the rows of a padded self."""
    big = torch.randn(2, 2 + 4)
    self_ = big[:, :2]  # elements 0, 1 and 6, 7 of the storage
    out = torch.as_strided(big, (2, 2), (2, 1), 2)  # elements 2..5: the gap
    with pytest.raises(MmOutArgumentError) as info:
        mm_out(out, self_, torch.randn(2, 2))
    assert info.value.rule == "cuda-device"


def test_operand_that_is_copied_first_may_overlap_out() -> None:
    """A strided operand is copied to a scratch before cuBLAS writes out, so sharing memory is safe."""
    buf = torch.randn(64)
    self_ = buf[: 2 * M * K].view(M, 2 * K)[:, ::2]  # a column step: always copied
    out = buf[:15].view(M, N)
    with pytest.raises(MmOutArgumentError) as info:
        mm_out(out, self_, torch.randn(K, N))
    assert info.value.rule == "cuda-device"


def test_a_missing_positional_argument_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        mm_out(torch.zeros(1, 1), torch.zeros(1, 1))  # type: ignore[call-arg]


def test_errors_survive_pickling() -> None:
    """pytest-xdist and multiprocessing ship exceptions between processes."""
    for err in (
        MmOutArgumentError("out", "out-shape", "detail"),
        CublasError("cublasGemmEx", 7, "CUBLAS_STATUS_INVALID_VALUE"),
        CublasNotFoundError(("a", "b"), ("c: no",)),
    ):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err)
        assert str(back) == str(err)
    err = MmOutArgumentError("out", "out-shape", "detail")
    assert pickle.loads(pickle.dumps(err)).rule == "out-shape"


def test_cublas_error_names_the_function_and_status() -> None:
    err = CublasError("cublasGemmEx", 7, cublas_library.CUBLAS_STATUS_NAMES[7])
    assert isinstance(err, RuntimeError)
    assert "cublasGemmEx" in str(err)
    assert "CUBLAS_STATUS_INVALID_VALUE" in str(err)


def test_negative_views_flip_alpha() -> None:
    x = torch.randn(2, 2)
    neg = torch._neg_view(x)
    assert mm_out_module.gemm_alpha(x, x, x) == 1.0
    assert mm_out_module.gemm_alpha(neg, x, x) == -1.0
    assert mm_out_module.gemm_alpha(neg, neg, x) == 1.0
    assert mm_out_module.gemm_alpha(neg, neg, neg) == -1.0


# --------------------------------------------------------------------------------------------------
# Library discovery and lifetime (CPU: the search and error paths; the real load is a GPU test)


def empty_locations(tmp_path: Path) -> cublas_library.SearchLocations:
    maps = tmp_path / "maps"
    maps.write_text("")
    return cublas_library.SearchLocations(
        maps_file=str(maps), nvidia_dirs=(), toolkit_dirs=(), find_library=None
    )


def test_nothing_found_lists_every_place_searched(tmp_path: Path) -> None:
    locations = empty_locations(tmp_path)
    with pytest.raises(CublasNotFoundError) as info:
        cublas_library.load_cublas(locations)
    message = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert len(info.value.searched) == 4
    for expected in (locations.maps_file, "nvidia pip wheels", "CUDA toolkit", "find_library"):
        assert expected in message, message


def test_the_cached_loader_reports_and_does_not_cache_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cublas_library, "_LIBRARY", None)
    monkeypatch.setattr(cublas_library, "default_search_locations", lambda: empty_locations(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # nothing to initialise
    for _ in range(2):
        with pytest.raises(CublasNotFoundError):
            cublas_library.load_cublas()
        assert cublas_library._LIBRARY is None


def test_discovery_order_and_failed_candidates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mapped library first, then wheels (torch's CUDA major first), then the toolkit; Lt is skipped."""
    nvidia = tmp_path / "site" / "nvidia"
    for rel in ("cu12/lib/libcublas.so.12", "cu13/lib/libcublas.so.13", "cu13/lib/libcublasLt.so.13"):
        (nvidia / rel).parent.mkdir(parents=True, exist_ok=True)
        (nvidia / rel).write_bytes(b"not an ELF file")
    toolkit = tmp_path / "cuda" / "lib64"
    toolkit.mkdir(parents=True)
    (toolkit / "libcublas.so").write_bytes(b"")
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /opt/x/libcublasLt.so.13\n"
        "7f01-7f02 r-xp 00000000 08:01 2 /opt/x/libcublas.so.13\n"
        "7f02-7f03 r--p 00001000 08:01 2 /opt/x/libcublas.so.13\n"
        "7f03-7f04 rw-p 00000000 00:00 0\n"
    )
    monkeypatch.setattr(cublas_library, "_torch_cuda_major", lambda: "13")
    locations = cublas_library.SearchLocations(
        maps_file=str(maps), nvidia_dirs=(str(nvidia),), toolkit_dirs=(str(toolkit),), find_library=None
    )
    candidates, _ = cublas_library.find_candidates(locations)
    assert candidates == [
        "/opt/x/libcublas.so.13",
        str(nvidia / "cu13/lib/libcublas.so.13"),
        str(nvidia / "cu12/lib/libcublas.so.12"),
        str(toolkit / "libcublas.so"),
    ]
    with pytest.raises(CublasNotFoundError) as info:
        cublas_library.load_cublas(locations)
    assert len(info.value.failures) == 4  # each candidate tried, and why it failed is reported
    assert all(candidate in str(info.value) for candidate in candidates)


@pytest.mark.proof
def test_importing_the_shim_loads_no_library() -> None:
    code = (
        "import reference_impl, reference_impl.shims as s\n"
        "from reference_impl.shims import cublas_library as c\n"
        "assert c._LIBRARY is None\n"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, timeout=120)


class _RecordingLibrary:
    """Stands in for libcublas only to test our handle lifecycle (create → thread exit → destroy)."""

    def __init__(self) -> None:
        self.created: list[int] = []
        self.destroyed: list[int] = []
        self.math_modes: list[tuple[int, int]] = []

    def create_handle(self) -> int:
        self.created.append(1000 + len(self.created))
        return self.created[-1]

    def destroy_handle(self, handle: int) -> int:
        self.destroyed.append(handle)
        return 0

    def set_math_mode(self, handle: int, mode: int) -> None:
        self.math_modes.append((handle, mode))


def test_each_thread_gets_its_own_handle_destroyed_when_the_thread_ends() -> None:
    library = _RecordingLibrary()
    seen: dict[str, int] = {}

    def worker(name: str) -> None:
        first = cublas_library.thread_handle(library, 0)  # type: ignore[arg-type]
        again = cublas_library.thread_handle(library, 0)  # type: ignore[arg-type]
        other_device = cublas_library.thread_handle(library, 1)  # type: ignore[arg-type]
        assert first is again
        assert other_device is not first
        seen[name] = first.handle

    threads = [threading.Thread(target=worker, args=(f"t{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(seen.values())) == 3  # one handle per (thread, device), never shared
    assert sorted(library.destroyed) == sorted(library.created)  # all six freed at thread exit
    assert all(mode == cublas_library.CUBLAS_DEFAULT_MATH for _, mode in library.math_modes)


# --------------------------------------------------------------------------------------------------
# GPU: the real computation. Skipped with the reason on machines without a CUDA device.

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
TOLERANCE = {torch.float32: 2e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def _operand(rows: int, cols: int, layout: str, dtype: torch.dtype) -> torch.Tensor:
    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, device="cuda") / max(1, cols) ** 0.5).to(dtype)

    if layout == "row-major":
        return rand(rows, cols)
    if layout == "transposed":
        return rand(cols, rows).t()
    if layout == "strided":
        return rand(rows, 2 * cols)[:, ::2]
    if layout == "padded":
        return rand(rows, cols + 5)[:, :cols]
    if layout == "size1-odd":  # a size-1 dimension with a stride torch would never pick
        base = rand(rows, cols).contiguous()
        strides = (base.stride(0) if rows > 1 else 9, base.stride(1) if cols > 1 else 13)
        return base.as_strided((rows, cols), strides)
    raise ValueError(layout)


GPU_LAYOUTS = ["row-major", "transposed", "strided", "padded", "size1-odd"]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("self_layout", GPU_LAYOUTS)
@pytest.mark.parametrize("mat2_layout", GPU_LAYOUTS)
def test_gpu_matches_float64_mm(dtype: torch.dtype, self_layout: str, mat2_layout: str) -> None:
    torch.manual_seed(0)
    for m, n, k in [(1, 1, 1), (7, 13, 5), (1, 17, 3), (9, 1, 11), (64, 33, 129)]:
        self_ = _operand(m, k, self_layout, dtype)
        mat2 = _operand(k, n, mat2_layout, dtype)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)  # beta = 0: never read
        mm_out(out, self_, mat2)
        expected = self_.double() @ mat2.double()
        tol = TOLERANCE[dtype]
        torch.testing.assert_close(out.double(), expected, rtol=tol, atol=tol)


@pytest.mark.gpu
@needs_cuda
def test_gpu_float32_does_not_use_tf32(monkeypatch: pytest.MonkeyPatch) -> None:
    """1 + 2**-15 needs 16 mantissa bits: TF32 (10) would round it to 1 and the sum to exactly 64."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)  # torch's flag must not leak in
    self_ = torch.full((4, 64), 1 + 2**-15, device="cuda")
    mat2 = torch.ones(64, 8, device="cuda")
    out = torch.empty(4, 8, device="cuda")
    mm_out(out, self_, mat2)
    assert torch.equal(out, torch.full_like(out, 64 + 2**-9))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_zero_sizes_follow_torch_mm(dtype: torch.dtype) -> None:
    out = torch.full((3, 4), float("nan"), device="cuda", dtype=dtype)
    mm_out(out, torch.empty(3, 0, device="cuda", dtype=dtype), torch.empty(0, 4, device="cuda", dtype=dtype))
    assert torch.equal(out, torch.zeros_like(out))  # K == 0: an empty sum
    for shape_self, shape_mat2 in [((0, 5), (5, 4)), ((3, 5), (5, 0)), ((0, 0), (0, 0))]:
        empty_out = torch.empty(shape_self[0], shape_mat2[1], device="cuda", dtype=dtype)
        mm_out(
            empty_out,
            torch.randn(shape_self, device="cuda").to(dtype),
            torch.randn(shape_mat2, device="cuda").to(dtype),
        )


@pytest.mark.gpu
@needs_cuda
def test_gpu_runs_on_the_callers_current_stream() -> None:
    """If mm_out ran on another stream it would read self before the side stream filled it."""
    a = torch.randn(256, 256, device="cuda")
    b = torch.randn(256, 256, device="cuda")
    self_ = torch.zeros(256, 256, device="cuda")
    out = torch.empty(256, 256, device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # keep the side stream busy
        self_.copy_(a)
        mm_out(out, self_, b)
    side.synchronize()
    torch.testing.assert_close(out, a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@needs_cuda
def test_gpu_threads_compute_concurrently_and_correctly() -> None:
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            gen = torch.Generator(device="cuda").manual_seed(seed)
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for _ in range(20):
                    x = torch.randn(65, 33, device="cuda", generator=gen)
                    w = torch.randn(17, 33, device="cuda", generator=gen)
                    out = torch.empty(65, 17, device="cuda")
                    mm_out(out, x, w.t())
                    torch.testing.assert_close(out, x @ w.t(), rtol=1e-4, atol=1e-4)
            stream.synchronize()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.mark.gpu
@needs_cuda
def test_gpu_negative_views_and_overlap() -> None:
    x = torch.randn(5, 6, device="cuda")
    w = torch.randn(6, 7, device="cuda")
    out = torch.empty(5, 7, device="cuda")
    mm_out(out, torch._neg_view(x), w)
    torch.testing.assert_close(out, -(x @ w), rtol=1e-4, atol=1e-4)
    square = torch.randn(4, 4, device="cuda")
    before = bits(square)
    with pytest.raises(MmOutArgumentError) as info:
        mm_out(square, square, torch.randn(4, 4, device="cuda"))
    assert info.value.rule == "no-overlap"
    assert torch.equal(bits(square), before)


@pytest.mark.gpu
@needs_cuda
def test_gpu_mixed_devices_name_the_cpu_tensor() -> None:
    out = filled(M, N, device="cuda")
    before = bits(out)
    with pytest.raises(MmOutArgumentError) as info:
        mm_out(out, torch.randn(M, K, device="cuda"), torch.randn(K, N))
    assert (info.value.argument, info.value.rule) == ("mat2", "cuda-device")
    assert torch.equal(bits(out), before)


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_gpu_tensors_on_two_devices_are_rejected_and_each_device_works() -> None:
    out = filled(M, N, device="cuda:1")
    before = bits(out)
    with pytest.raises(MmOutArgumentError) as info:
        mm_out(out, torch.randn(M, K, device="cuda:0"), torch.randn(K, N, device="cuda:1"))
    assert (info.value.argument, info.value.rule) == ("self", "same-device")
    assert torch.equal(bits(out), before)
    for device in ("cuda:0", "cuda:1"):  # the current device must not matter
        a, b = torch.randn(M, K, device=device), torch.randn(K, N, device=device)
        result = torch.empty(M, N, device=device)
        mm_out(result, a, b)
        torch.testing.assert_close(result, a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@needs_cuda
def test_gpu_missing_library_leaves_out_untouched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cublas_library, "_LIBRARY", None)
    monkeypatch.setattr(cublas_library, "default_search_locations", lambda: empty_locations(tmp_path))
    monkeypatch.setattr(cublas_library, "_mapped_libraries", lambda _: ["(pretend torch mapped one)"])
    out = filled(M, N, device="cuda")
    before = bits(out)
    with pytest.raises(CublasNotFoundError):
        mm_out(out, torch.randn(M, K, device="cuda"), torch.randn(K, N, device="cuda"))
    assert torch.equal(bits(out), before)


@pytest.mark.gpu
@needs_cuda
def test_gpu_uses_the_libcublas_torch_loaded() -> None:
    library = cublas_library.load_cublas()
    assert "libcublas" in library.path
    mapped = cublas_library._mapped_libraries("/proc/self/maps")
    assert library.path in mapped, (library.path, mapped)
