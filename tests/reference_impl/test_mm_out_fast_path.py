"""Self-tests of ``mm_out``'s fast path: which calls take it, and that it computes what the full path does.

The key, extent and overlap rules are metadata arithmetic (CPU). The GPU part (marked ``gpu``) counts
the full-path calls to show a repeated call skips them, and sends every per-call exception (negative
views, an overlapping ``out``, another current device) back through the full checks.
"""

from __future__ import annotations

import importlib
import threading

import pytest
import torch

from reference_impl.shims import MmOutArgumentError, mm_out
from reference_impl.shims.call_cache import (
    CallCache,
    FastCall,
    call_key,
    extent_bytes,
    may_overlap,
)
from reference_impl.shims.gemm_plan import plan_gemm

mm_out_module = importlib.import_module("reference_impl.shims.mm_out")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_key_covers_every_checked_property() -> None:
    a, b, out = torch.randn(3, 4), torch.randn(4, 5), torch.empty(3, 5)
    key = call_key(out, a, b)
    assert key is not None
    assert call_key(out, a, b) == key
    # Any change a check looks at gives another key.
    assert call_key(out, a.t().contiguous().t(), b) != key  # strides
    assert call_key(out, a.half(), b) != key  # dtype
    assert call_key(torch.empty(5, 3), torch.randn(5, 4), torch.randn(4, 3)) != key  # shapes


def test_unusual_calls_have_no_key() -> None:
    a, b, out = torch.randn(3, 4), torch.randn(4, 5), torch.empty(3, 5)
    assert call_key(out, torch.nn.Parameter(a), b) is None  # a subclass may override anything
    assert call_key(out, a.to_sparse(), b) is None  # no strides to key on
    assert call_key(None, a, b) is None
    assert call_key(out, a, [[1.0]]) is None


@pytest.mark.parametrize(
    ("make", "expected_elements"),
    [
        (lambda: torch.empty(3, 5), 15),
        (lambda: torch.empty(5, 3).t(), 15),
        (lambda: torch.empty(4, 10)[:, :3], 3 * 10 + 3),  # 4 rows of 3, pitch 10
        (lambda: torch.empty(0, 7), 0),
        (lambda: torch.empty(1, 1).expand(6, 6), 1),
    ],
)
def test_extent_is_first_to_past_last_element(make, expected_elements: int) -> None:
    t = make()
    assert extent_bytes(t) == expected_elements * t.element_size()


def _fast_call(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> FastCall:
    plan = plan_gemm(a.shape[0], b.shape[1], a.shape[1], a.stride(), b.stride())
    return FastCall(plan, 0, 0, extent_bytes(out), extent_bytes(a), extent_bytes(b))


def test_overlap_check_is_conservative() -> None:
    storage = torch.empty(1000)
    a, b = storage[0:12].view(3, 4), storage[12:32].view(4, 5)
    apart = storage[100:115].view(3, 5)
    assert not may_overlap(apart, a, b, _fast_call(apart, a, b))
    touching = storage[32:47].view(3, 5)  # starts right after b ends
    assert not may_overlap(touching, a, b, _fast_call(touching, a, b))
    on_b = storage[31:46].view(3, 5)  # shares b's last element
    assert may_overlap(on_b, a, b, _fast_call(on_b, a, b))
    # Interleaved but disjoint (out in the gaps of a padded operand): "may", so the exact check decides.
    padded = storage[200:240].view(4, 10)[:, :5]
    gaps = storage[205:240].view(7, 5)[::2][:3]
    assert may_overlap(gaps, a, padded, _fast_call(gaps, a, padded))


def test_cache_starts_over_when_full() -> None:
    cache = CallCache(max_entries=2)
    call = _fast_call(torch.empty(3, 5), torch.empty(3, 4), torch.empty(4, 5))
    for i in range(5):
        cache.put((i,), call)
    assert 1 <= len(cache) <= 2
    assert cache.get((4,)) is call


def test_cpu_calls_are_rejected_and_never_cached() -> None:
    mm_out_module.CALLS.clear()
    out = torch.full((3, 5), float("nan"))
    for _ in range(2):
        with pytest.raises(MmOutArgumentError) as info:
            mm_out(out, torch.randn(3, 4), torch.randn(4, 5))
        assert info.value.rule == "cuda-device"
    assert len(mm_out_module.CALLS) == 0
    assert out.isnan().all()


# ---------------------------------------------------------------------------------------------- GPU


@pytest.fixture
def full_path_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the calls that went through the full checks; starts with an empty cache."""
    mm_out_module.CALLS.clear()
    calls: list[int] = []
    checked = mm_out_module._mm_out_checked

    def counting(*args: object) -> None:
        calls.append(1)
        checked(*args)

    monkeypatch.setattr(mm_out_module, "_mm_out_checked", counting)
    return calls


def _reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.double() @ b.double()).to(a.dtype)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["row-major", "transposed-mat2", "transposed-self", "padded"])
def test_gpu_repeated_calls_take_the_fast_path_and_match(
    full_path_calls: list[int], dtype: torch.dtype, layout: str
) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    m, k, n = 67, 129, 33
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    if layout == "transposed-mat2":
        b = torch.randn(n, k, device="cuda", dtype=dtype).t()
    elif layout == "transposed-self":
        a = torch.randn(k, m, device="cuda", dtype=dtype).t()
    elif layout == "padded":
        a = torch.randn(m, k + 7, device="cuda", dtype=dtype)[:, :k]
    for _ in range(4):
        a.normal_()  # new values each time: the fast path must read them, not a cached result
        out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
        mm_out(out, a, b)
        tol = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
        torch.testing.assert_close(out, _reference(a, b), rtol=tol, atol=tol * k**0.5)
    assert len(full_path_calls) == 1, "only the first call of a shape should run the full checks"


@pytest.mark.gpu
@needs_cuda
def test_gpu_negative_views_go_through_the_full_path(full_path_calls: list[int]) -> None:
    a, b = torch.randn(8, 16, device="cuda"), torch.randn(16, 4, device="cuda")
    out = torch.empty(8, 4, device="cuda")
    mm_out(out, a, b)  # caches the key
    negated = torch._neg_view(a)
    mm_out(out, negated, b)
    torch.testing.assert_close(out, -(a @ b), rtol=1e-4, atol=1e-4)
    assert len(full_path_calls) == 2


@pytest.mark.gpu
@needs_cuda
def test_gpu_overlapping_out_is_caught_after_the_key_was_cached(full_path_calls: list[int]) -> None:
    storage = torch.randn(64 + 16, device="cuda")
    a, b = storage[:64].view(8, 8), torch.randn(8, 2, device="cuda")
    mm_out(torch.empty(8, 2, device="cuda"), a, b)  # caches the key with a harmless out
    out = storage[:16].view(8, 2)  # same shapes, but lies on a
    before = storage.clone()
    with pytest.raises(MmOutArgumentError) as info:
        mm_out(out, a, b)
    assert (info.value.argument, info.value.rule) == ("out", "no-overlap")
    assert torch.equal(storage, before)


@pytest.mark.gpu
@needs_cuda
def test_gpu_fast_path_from_many_threads(full_path_calls: list[int]) -> None:
    a, b = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
    expected = a @ b
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                out = torch.empty(64, 64, device="cuda")
                for _ in range(200):
                    mm_out(out, a, b)
                stream.synchronize()
                torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
        except BaseException as exc:  # reported on the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert len(full_path_calls) <= 8  # at most each thread's first call races the cache fill


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_gpu_another_current_device_takes_the_full_path(full_path_calls: list[int]) -> None:
    a, b = torch.randn(8, 16, device="cuda:1"), torch.randn(16, 4, device="cuda:1")
    out = torch.empty(8, 4, device="cuda:1")
    with torch.cuda.device(1):
        mm_out(out, a, b)
    with torch.cuda.device(0):
        mm_out(out, a, b)  # the handle and the stream must be cuda:1's: the full path switches
    torch.testing.assert_close(out, a @ b, rtol=1e-4, atol=1e-4)
    assert len(full_path_calls) == 2
