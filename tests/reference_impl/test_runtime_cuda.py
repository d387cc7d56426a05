"""The runtime on a GPU (``-m gpu``, skipped with "needs CUDA" otherwise): the handle's device, pinned
outputs and the skip-copy option, staging inputs, streams and threads. The CPU tests are in test_runtime.py.
"""

from __future__ import annotations

import pytest
import torch
import torch._inductor
import torch.nn.attention

from reference_impl.runtime import (
    InputError,
    OutputError,
    destroy,
    execute,
    execute_stats,
    init,
)
from reference_impl.runtime import options as opts
from reference_impl.runtime.options import SKIP_COPY_OUTPUT_TO_CPU_FOR_METHOD as SKIP
from tests.reference_impl.runtime_support import (
    COLS,
    MAX_ROWS,
    _assert_outputs,
    _hammer,
    _inputs,
    _nbytes,
    _reset_options,  # noqa: F401 (an autouse fixture: options reset around each test of this module)
    _two_out_export_args,
    compiled_artifact,
    make_program,
    needs_cuda,
)

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
