"""The runtime on real AOTInductor artifacts: init/execute/destroy, bad arguments, data movement, streams,
threads.

CPU tests run everywhere. GPU tests (``-m gpu``) need CUDA and are skipped with "needs CUDA" otherwise.
Artifacts are compiled once per (model source, torch build, device) and cached on disk in
``$RUNTIME_TEST_ARTIFACTS`` (default ``/tmp/runtime-test-artifacts``); a file lock keeps xdist workers from
compiling the same artifact twice.
"""

from __future__ import annotations

import inspect
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._inductor
import torch.nn.attention
from torch import nn

from reference_impl.artifact_cache import ArtifactCache, make_key
from reference_impl.format.blob import pack_blob
from reference_impl.format.errors import LoweringFormatError
from reference_impl.format.iospec import io_spec_from_exported_program
from reference_impl.format.program import build_program, program_to_bytes
from reference_impl.runtime import (
    DestroyedHandleError,
    InputError,
    OutputError,
    RuntimeArgumentError,
    destroy,
    execute,
    execute_stats,
    init,
)
from reference_impl.runtime import options as opts
from reference_impl.runtime.options import SKIP_COPY_OUTPUT_TO_CPU_FOR_METHOD as SKIP

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("RUNTIME_TEST_ARTIFACTS", "/tmp/runtime-test-artifacts"))


# --- models ---------------------------------------------------------------------------------------------

COLS = 64
MAX_ROWS = 4096


class TwoOut(nn.Module):
    """x, y [rows, 64] → (x + y, 2x - y); rows dynamic in [1, 4096]."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + y, x * 2.0 - y


def _two_out_export_args(device: str) -> tuple[nn.Module, tuple[Any, ...], Any]:
    rows = torch.export.Dim("rows", min=1, max=MAX_ROWS)
    example = (torch.randn(4, COLS, device=device), torch.randn(4, COLS, device=device))
    return TwoOut(), example, {"x": {0: rows}, "y": {0: rows}}


# --- artifact cache -------------------------------------------------------------------------------------


def _key(name: str, device: str) -> str:
    """What the artifact is built from (this file's toy model) and with (torch, CUDA, device)."""
    return make_key(
        {
            "model": inspect.getsource(TwoOut) + inspect.getsource(_two_out_export_args),
            "name": name,
            "device": device,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "capability": torch.cuda.get_device_capability() if device == "cuda" else None,
        }
    )


def compiled_artifact(name: str, make: Callable[[str], Any], device: str) -> tuple[bytes, dict[str, Any]]:
    """(AOTInductor package bytes, io spec JSON) for one method, compiled at most once per toolchain."""
    module, example, dynamic = make(device)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(module, example, dynamic_shapes=dynamic, strict=False)

    def build() -> bytes:
        with tempfile.TemporaryDirectory() as folder, torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            package = Path(folder) / "artifact.pt2"  # the packager wants a name ending in .pt2
            torch._inductor.aoti_compile_and_package(ep, package_path=str(package))
            return package.read_bytes()

    # The project's content-addressed cache: atomic entries, per-key lock across xdist workers.
    artifact = ArtifactCache(CACHE).get_or_build(_key(name, device), build).data
    return artifact, io_spec_from_exported_program(ep).to_json()


def make_program(methods: dict[str, tuple[bytes, dict[str, Any] | None]], device: str) -> bytes:
    blobs = [
        (
            name,
            pack_blob(
                artifact,
                method_name=name,
                device=device,
                torch_version=torch.__version__,
                cuda_version=torch.version.cuda,
                extra={} if io is None else {"io": io},
            ),
        )
        for name, (artifact, io) in methods.items()
    ]
    return program_to_bytes(build_program(blobs))


# --- fixtures -------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _reset_options() -> Iterator[None]:
    opts.reset_options()
    yield
    opts.reset_options()


@pytest.fixture(scope="module")
def cpu_two_out() -> tuple[bytes, dict[str, Any]]:
    return compiled_artifact("two_out", _two_out_export_args, "cpu")


@pytest.fixture(scope="module")
def cpu_program(cpu_two_out) -> bytes:
    artifact, io = cpu_two_out
    return make_program({"forward": (artifact, io), "other": (artifact, io)}, "cpu")


@pytest.fixture
def handle(cpu_program):
    h = init(cpu_program, "forward")
    yield h
    if not h.destroyed:
        destroy(h)


def _inputs(rows: int = 4, seed: int = 0, device: str = "cpu") -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, COLS, generator=g).to(device) for _ in range(2)]


def _expected(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    return [(x + y).cpu(), (x * 2.0 - y).cpu()]


def _assert_outputs(got: list[torch.Tensor], inputs: list[torch.Tensor]) -> None:
    assert len(got) == 2
    for g, e in zip(got, _expected(*inputs), strict=True):
        torch.testing.assert_close(g.cpu(), e)


# --- CPU: init / execute / destroy ----------------------------------------------------------------------


def test_init_reads_method_name_device_and_io(handle) -> None:
    assert handle.method_name == "forward"
    assert handle.device == torch.device("cpu")
    assert (handle.num_inputs, handle.num_outputs) == (2, 2)
    assert handle.io is not None
    assert handle.io.inputs[0].dtype == torch.float32
    assert execute_stats(handle) == {"h2d_bytes": 0, "d2h_bytes": 0}


@pytest.mark.parametrize("rows", [1, 4, 37])
def test_execute_matches_eager_for_dynamic_rows(handle, rows: int) -> None:
    inputs = _inputs(rows)
    out = execute(handle, inputs)
    _assert_outputs(out, inputs)
    assert all(t.device.type == "cpu" for t in out)


def test_counters_are_zero_for_a_cpu_target(handle) -> None:
    execute(handle, _inputs())
    assert execute_stats(handle) == {"h2d_bytes": 0, "d2h_bytes": 0}


def test_skip_option_does_not_change_a_cpu_target(handle) -> None:
    opts.set_option(SKIP, "forward")
    out = execute(handle, _inputs())
    assert all(t.device.type == "cpu" for t in out)
    assert execute_stats(handle) == {"h2d_bytes": 0, "d2h_bytes": 0}


def test_execute_accepts_a_tuple_and_non_contiguous_inputs(handle) -> None:
    x = torch.randn(COLS, 6).t()  # [6, 64], not contiguous
    y = torch.randn(6, COLS)
    assert not x.is_contiguous()
    _assert_outputs(execute(handle, (x, y)), [x, y])


def test_two_handles_of_one_program_and_repeated_executes(cpu_program) -> None:
    a, b = init(cpu_program, "forward"), init(cpu_program, "other")
    try:
        assert b.method_name == "other"
        for seed in range(3):
            inputs = _inputs(3, seed)
            _assert_outputs(execute(a, inputs), inputs)
            _assert_outputs(execute(b, inputs), inputs)
    finally:
        destroy(a)
        destroy(b)


def test_outputs_of_one_execute_survive_the_next(handle) -> None:
    first_in, second_in = _inputs(4, 1), _inputs(4, 2)
    first = execute(handle, first_in)
    kept = [t.clone() for t in first]
    execute(handle, second_in)
    for a, b in zip(first, kept, strict=True):
        assert torch.equal(a, b)


# --- CPU: caller-provided outputs -----------------------------------------------------------------------


def test_caller_outputs_are_filled_in_place(handle) -> None:
    inputs = _inputs(5)
    provided = [torch.full((5, COLS), float("nan")) for _ in range(2)]
    out = execute(handle, inputs, outputs=provided)
    assert out[0] is provided[0]
    assert out[1] is provided[1]
    _assert_outputs(provided, inputs)


def test_caller_outputs_may_be_non_contiguous(handle) -> None:
    inputs = _inputs(5)
    provided = [torch.empty(COLS, 5).t() for _ in range(2)]
    execute(handle, inputs, outputs=provided)
    _assert_outputs(provided, inputs)


def _sentinel(*shape: int, **kwargs: Any) -> torch.Tensor:
    return torch.full(shape, 7.0, **kwargs)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: [_sentinel(5, COLS)], "returns 2 tensor"),
        (lambda: [_sentinel(5, COLS) for _ in range(3)], "returns 2 tensor"),
        (lambda: [_sentinel(5, COLS), _sentinel(5, COLS, dtype=torch.float64)], r"outputs\[1\].*dtype"),
        # rows are dynamic: this one is caught after the run, before anything is written
        (lambda: [_sentinel(5, COLS), _sentinel(4, COLS)], r"outputs\[1\].*shape \[5, 64\]"),
        (lambda: [_sentinel(5, COLS), _sentinel(5, COLS + 1)], r"outputs\[1\].*shape"),
        (
            lambda: [_sentinel(5, COLS), torch.empty(5, COLS, device="meta")],
            r"outputs\[1\].*device must be 'cpu'",
        ),
        (lambda: [_sentinel(5, COLS), 3], r"outputs\[1\] must be a torch.Tensor"),
        (lambda: _sentinel(5, COLS), "outputs must be a list or tuple"),
    ],
)
def test_bad_caller_outputs_are_rejected_and_left_untouched(handle, make, match) -> None:
    provided = make()
    with pytest.raises(OutputError, match=match):
        execute(handle, _inputs(5), outputs=provided)
    for tensor in provided if isinstance(provided, list) else [provided]:
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu":
            assert torch.all(tensor == 7.0), "a rejected execute wrote into a caller output"


# --- CPU: bad inputs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: _inputs()[:1], "takes 2 tensor"),
        (lambda: [*_inputs(), torch.ones(4, COLS)], "takes 2 tensor"),
        (lambda: [], "takes 2 tensor"),
        (
            lambda: [_inputs()[0], _inputs()[1].double()],
            r"inputs\[1\].*dtype torch.float32, got torch.float64",
        ),
        (lambda: [_inputs()[0].half(), _inputs()[1]], r"inputs\[0\].*dtype"),
        (lambda: [torch.ones(4, COLS - 1), torch.ones(4, COLS)], r"inputs\[0\].*dim 1 must be 64"),
        (lambda: [torch.ones(4, COLS, 1), torch.ones(4, COLS)], r"inputs\[0\].*2-d tensor"),
        (
            lambda: [torch.ones(4, COLS), torch.ones(5, COLS)],
            r"inputs\[1\].*dim 0 has size 5.*inputs\[0\] dim 0",
        ),
        (
            lambda: [torch.ones(MAX_ROWS + 1, COLS)] * 2,
            rf"inputs\[0\].*size {MAX_ROWS + 1}.*\[1, {MAX_ROWS}\]",
        ),
        (lambda: [torch.ones(0, COLS)] * 2, r"inputs\[0\].*size 0.*\[1, "),
        (
            lambda: [torch.ones(4, COLS, device="meta"), torch.ones(4, COLS)],
            r"inputs\[0\]: device must be 'cpu'",
        ),
        (lambda: [torch.ones(4, COLS), "x"], r"inputs\[1\] must be a torch.Tensor"),
        (lambda: torch.ones(4, COLS), "inputs must be a list or tuple"),
        (lambda: None, "inputs must be a list or tuple"),
        (lambda: [torch.ones(4, COLS).to_sparse(), torch.ones(4, COLS)], r"inputs\[0\].*dense"),
    ],
)
def test_bad_inputs_are_rejected_naming_the_argument(handle, make, match) -> None:
    with pytest.raises(InputError, match=match) as info:
        execute(handle, make())
    assert isinstance(info.value, ValueError)
    # The handle still works afterwards.
    inputs = _inputs()
    _assert_outputs(execute(handle, inputs), inputs)


def test_destroyed_handle_is_rejected_everywhere(cpu_program) -> None:
    h = init(cpu_program, "forward")
    destroy(h)
    assert h.destroyed
    for call in (lambda: execute(h, _inputs()), lambda: execute_stats(h), lambda: destroy(h)):
        with pytest.raises(DestroyedHandleError, match="destroyed"):
            call()


@pytest.mark.parametrize("not_a_handle", [None, "forward", object()])
def test_non_handles_are_rejected(not_a_handle) -> None:
    with pytest.raises(RuntimeArgumentError, match="DelegateHandle"):
        execute(not_a_handle, _inputs())
    with pytest.raises(RuntimeArgumentError, match="DelegateHandle"):
        destroy(not_a_handle)


# --- CPU: bad programs and methods ----------------------------------------------------------------------


def test_unknown_method_names_the_available_ones(cpu_program) -> None:
    with pytest.raises(ValueError, match=r"no method 'decoder'.*forward.*other"):
        init(cpu_program, "decoder")
    with pytest.raises(ValueError, match="no method 'Forward'"):
        init(cpu_program, "Forward")  # case-sensitive


def test_non_string_method_is_rejected(cpu_program) -> None:
    with pytest.raises(RuntimeArgumentError, match="method must be a str"):
        init(cpu_program, None)


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d[: len(d) // 2],
        lambda d: d[:10],
        lambda d: b"",
        lambda d: d + b"\0",
        lambda d: d[:-1] + bytes([d[-1] ^ 1]),
        lambda d: d[:20] + bytes([d[20] ^ 0x40]) + d[21:],
        lambda d: b"not a program at all" * 4,
    ],
)
def test_corrupt_or_truncated_programs_fail_cleanly(cpu_program, damage) -> None:
    with pytest.raises(LoweringFormatError):
        init(damage(cpu_program), "forward")


def test_non_bytes_program_is_rejected() -> None:
    with pytest.raises(ValueError, match="bytes"):
        init("program.bin", "forward")


def test_cpu_program_refuses_a_cuda_device(cpu_program) -> None:
    with pytest.raises(RuntimeArgumentError, match="lowered for the CPU"):
        init(cpu_program, "forward", device="cuda:0")


def test_program_without_io_metadata_still_checks_count_and_device(cpu_two_out) -> None:
    artifact, _ = cpu_two_out
    h = init(make_program({"forward": (artifact, None)}, "cpu"), "forward")
    try:
        assert h.io is None
        assert h.num_inputs == 2
        with pytest.raises(InputError, match="takes 2 tensor"):
            execute(h, _inputs()[:1])
        with pytest.raises(InputError, match="device"):
            execute(h, [torch.ones(4, COLS, device="meta")] * 2)
        inputs = _inputs()
        _assert_outputs(execute(h, inputs), inputs)
    finally:
        destroy(h)


def test_malformed_io_metadata_is_rejected(cpu_two_out) -> None:
    artifact, io = cpu_two_out
    bad = {**io, "inputs": [{"dtype": "float99", "shape": [1], "strides": None}]}
    with pytest.raises(RuntimeArgumentError, match="unknown dtype"):
        init(make_program({"forward": (artifact, bad)}, "cpu"), "forward")


# --- CPU: threads ---------------------------------------------------------------------------------------


def _hammer(handles: list, threads: int, per_thread: int, flip_options: bool, device: str) -> list[str]:
    errors: list[str] = []
    stop = threading.Event()

    def flipper() -> None:
        i = 0
        while not stop.is_set():
            opts.set_option(SKIP, ["forward", "", "other, forward", "other"][i % 4])
            i += 1
            time.sleep(0.0002)  # flip thousands of times a second without starving the workers of the GIL

    def worker(index: int) -> None:
        h = handles[index % len(handles)]
        try:
            for step in range(per_thread):
                rows = 1 + (index * 7 + step) % 9
                inputs = _inputs(rows, seed=index * 1000 + step, device=device if step % 2 else "cpu")
                out = execute(h, inputs)
                for got, want in zip(out, _expected(*inputs), strict=True):
                    if not torch.allclose(got.cpu(), want):
                        errors.append(f"thread {index} step {step}: wrong values")
                        return
        except Exception as exc:  # pragma: no cover - reported through the assertion
            errors.append(f"thread {index}: {type(exc).__name__}: {exc}")

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    side = threading.Thread(target=flipper) if flip_options else None
    if side:
        side.start()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    stop.set()
    if side:
        side.join()
    return errors


def test_threads_on_one_and_on_different_handles_cpu(cpu_program) -> None:
    handles = [init(cpu_program, "forward"), init(cpu_program, "other")]
    try:
        assert _hammer(handles, threads=4, per_thread=25, flip_options=True, device="cpu") == []
    finally:
        for h in handles:
            destroy(h)


def test_destroy_while_other_threads_execute_is_safe(cpu_program) -> None:
    h = init(cpu_program, "forward")
    outcomes: list[str] = []
    start = threading.Barrier(3)

    def worker() -> None:
        start.wait()
        for _ in range(50):
            try:
                inputs = _inputs(3)
                _assert_outputs(execute(h, inputs), inputs)
            except DestroyedHandleError:
                outcomes.append("destroyed")
                return
            except Exception as exc:  # pragma: no cover
                outcomes.append(f"{type(exc).__name__}: {exc}")
                return
        outcomes.append("done")

    pool = [threading.Thread(target=worker) for _ in range(2)]
    for t in pool:
        t.start()
    start.wait()
    destroy(h)
    for t in pool:
        t.join()
    assert set(outcomes) <= {"destroyed", "done"}, outcomes


# --- GPU ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cuda_program() -> bytes:
    artifact, io = compiled_artifact("two_out", _two_out_export_args, "cuda")
    return make_program({"forward": (artifact, io), "other": (artifact, io)}, "cuda")


@pytest.fixture
def cuda_handle(cuda_program):
    h = init(cuda_program, "forward")
    yield h
    if not h.destroyed:
        destroy(h)


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.gpu
@needs_cuda
def test_gpu_init_places_the_handle_on_the_current_device(cuda_handle) -> None:
    assert cuda_handle.device == torch.device("cuda", torch.cuda.current_device())
    assert "caller-current-stream" in cuda_handle.stream_policy


@pytest.mark.gpu
@needs_cuda
def test_gpu_without_skip_outputs_are_pinned_cpu_and_counters_match(cuda_handle) -> None:
    inputs = _inputs(33)
    out = execute(cuda_handle, inputs)
    _assert_outputs(out, inputs)
    assert all(t.device.type == "cpu" and t.is_pinned() for t in out)
    assert execute_stats(cuda_handle) == {"h2d_bytes": _nbytes(inputs), "d2h_bytes": _nbytes(out)}


@pytest.mark.gpu
@needs_cuda
def test_gpu_skip_copy_keeps_outputs_on_the_device(cuda_handle) -> None:
    opts.set_option(SKIP, " other ,forward,")
    inputs = _inputs(33)
    out = execute(cuda_handle, inputs)
    assert all(t.device == cuda_handle.device for t in out)
    _assert_outputs(out, inputs)
    assert execute_stats(cuda_handle) == {"h2d_bytes": _nbytes(inputs), "d2h_bytes": 0}
    # Effective on the next execute, both ways.
    opts.set_option(SKIP, "Forward")  # case-sensitive: no match
    out = execute(cuda_handle, inputs)
    assert all(t.device.type == "cpu" for t in out)
    assert execute_stats(cuda_handle)["d2h_bytes"] == _nbytes(out)


@pytest.mark.gpu
@needs_cuda
def test_gpu_device_inputs_are_used_without_a_copy(cuda_handle) -> None:
    opts.set_option(SKIP, "forward")
    inputs = _inputs(17, device="cuda")
    out = execute(cuda_handle, inputs)
    _assert_outputs(out, inputs)
    assert execute_stats(cuda_handle) == {"h2d_bytes": 0, "d2h_bytes": 0}
    # Mixed: one on the device, one on the CPU.
    mixed = [inputs[0], inputs[1].cpu()]
    execute(cuda_handle, mixed)
    assert execute_stats(cuda_handle)["h2d_bytes"] == _nbytes(mixed[1:])


@pytest.mark.gpu
@needs_cuda
def test_gpu_inputs_are_staged_through_pinned_memory(cuda_handle) -> None:
    inputs = _inputs(64)
    execute(cuda_handle, inputs)
    staging = cuda_handle.staging_buffer
    assert staging is not None
    assert staging.is_pinned()
    assert staging.numel() >= _nbytes(inputs)
    # The profiler must see host↔device copies only from/to pinned memory.
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        execute(cuda_handle, _inputs(64, seed=3))
        torch.cuda.synchronize()
    # Device-side copy records are named "Memcpy HtoD (Pinned -> Device)" and the like (not "cudaMemcpy...").
    names = [e.name for e in prof.events() if e.name.startswith("Memcpy")]
    if not names:
        pytest.skip("the profiler recorded no memcpy activity (CUPTI unavailable)")
    assert any("HtoD" in n for n in names), names
    assert not [n for n in names if "Pageable" in n], names
    # The buffer is reused, not reallocated, for same-size inputs.
    assert cuda_handle.staging_buffer.data_ptr() == staging.data_ptr()


@pytest.mark.gpu
@needs_cuda
def test_gpu_outputs_are_not_views_of_reused_buffers(cuda_handle) -> None:
    for skip in ("", "forward"):
        opts.set_option(SKIP, skip)
        first = execute(cuda_handle, _inputs(8, seed=1))
        kept = [t.clone() for t in first]
        execute(cuda_handle, _inputs(8, seed=2))
        for a, b in zip(first, kept, strict=True):
            assert torch.equal(a, b)


@pytest.mark.gpu
@needs_cuda
def test_gpu_caller_outputs_on_the_right_device(cuda_handle) -> None:
    inputs = _inputs(9)
    host = [torch.empty(9, COLS), torch.empty(9, COLS, pin_memory=True)]  # pageable and pinned
    assert execute(cuda_handle, inputs, outputs=host)[0] is host[0]
    _assert_outputs(host, inputs)
    opts.set_option(SKIP, "forward")
    with pytest.raises(OutputError, match="device must be 'cuda"):
        execute(cuda_handle, inputs, outputs=host)
    dev = [torch.empty(9, COLS, device=cuda_handle.device) for _ in range(2)]
    assert execute(cuda_handle, inputs, outputs=dev)[1] is dev[1]
    _assert_outputs(dev, inputs)
    opts.set_option(SKIP, "")
    with pytest.raises(OutputError, match="device must be 'cpu'"):
        execute(cuda_handle, inputs, outputs=dev)


@pytest.mark.gpu
@needs_cuda
def test_gpu_input_on_another_device_is_rejected(cuda_handle) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    other = (cuda_handle.device.index + 1) % torch.cuda.device_count()
    with pytest.raises(InputError, match=r"inputs\[0\]: device must be 'cpu' or 'cuda:"):
        execute(cuda_handle, [torch.ones(4, COLS, device=f"cuda:{other}"), torch.ones(4, COLS)])


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("inputs_on", ["cpu", "cuda"])
def test_gpu_consumer_on_another_stream_sees_finished_data(cuda_handle, inputs_on: str) -> None:
    """A long busy kernel precedes the work on the caller's stream; a consumer on another stream, with no
    synchronisation of its own, must still read the finished outputs (upstream #21727, #22318)."""
    opts.set_option(SKIP, "forward")
    consumer = torch.cuda.Stream()
    rows = MAX_ROWS
    for run in range(100):
        x = torch.full((rows, COLS), float(run), device=inputs_on)
        y = torch.full((rows, COLS), 1.0, device=inputs_on)
        torch.cuda._sleep(2_000_000)  # ~1 ms of spinning on the current stream, queued before execute
        out = execute(cuda_handle, [x, y])
        with torch.cuda.stream(consumer):
            seen = [t.clone() for t in out]
        consumer.synchronize()
        assert torch.all(seen[0] == run + 1.0), f"run {run}: consumer saw unfinished x + y"
        assert torch.all(seen[1] == 2.0 * run - 1.0), f"run {run}: consumer saw unfinished 2x - y"


@pytest.mark.gpu
@needs_cuda
def test_gpu_work_runs_on_the_callers_current_stream(cuda_handle) -> None:
    opts.set_option(SKIP, "forward")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.full((1024, COLS), 3.0, device="cuda")
        torch.cuda._sleep(20_000_000)
        x.add_(1.0)  # produced on `side`: execute on `side` must see 4.0 without any extra sync
        out = execute(cuda_handle, [x, torch.zeros(1024, COLS, device="cuda")])
    assert torch.all(out[0] == 4.0)


@pytest.mark.gpu
@needs_cuda
def test_gpu_threads_and_option_flipping(cuda_program) -> None:
    handles = [init(cuda_program, "forward"), init(cuda_program, "other")]
    try:
        assert _hammer(handles, threads=8, per_thread=200, flip_options=True, device="cuda") == []
    finally:
        for h in handles:
            destroy(h)
