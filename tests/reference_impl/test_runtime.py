"""The runtime on real AOTInductor artifacts, on the CPU: init/execute/destroy, caller-provided outputs, bad
arguments, bad programs and methods, threads.

These run everywhere; the GPU tests are in test_runtime_cuda.py. The toy model and its artifacts (compiled
once per model source, torch build and device, cached on disk) are in runtime_support.py.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
import torch._inductor
import torch.nn.attention

from reference_impl.format.errors import LoweringFormatError
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
from tests.reference_impl.runtime_support import (
    COLS,
    MAX_ROWS,
    _assert_outputs,
    _hammer,
    _inputs,
    _reset_options,  # noqa: F401 (an autouse fixture: options reset around each test of this module)
    _two_out_export_args,
    compiled_artifact,
    make_program,
)

# --- fixtures -------------------------------------------------------------------------------------------


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
