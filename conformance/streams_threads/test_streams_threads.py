"""Chapter streams & threads — whatever stream or thread the consumer uses, it sees finished data (SPEC §1b).

Upstream shipped two ordering bugs this chapter exists to catch:

* **#21727** — a delegate returned before its stream finished: a consumer that read the outputs on another
  stream right away read unfinished data. ``streams_threads/other-consumer``: 100 runs in a row, each with the
  caller's current stream held first for ``HOLD_S`` (``harness/stream_hold.py``: a wait in the GPU's
  front end that also ends once the consumer has read, or with ``$CONFORMANCE_STREAM_HOLDS=spin`` a spin
  kernel), so the method's work is still queued when a lazy backend returns; a consumer on a fresh stream
  sums the output immediately; every sum must be exact.
* **#22318** — per-handle streams gave no ordering between delegates (9 different sums in 40 runs).
  ``streams_threads/chained-delegates``: one handle's output fed into another on the GPU (two programs, or two
  methods of one program), 50 runs, every sum identical and exact.

And ``streams_threads/threads``: 8 threads on one handle, and 8 threads on their own handles (of two
programs), 200 executes each, while another thread flips the skip-copy option; every result equals the serial
result, no exception, no deadlock. A reduced version (4 threads × 50, CPU programs) runs without a GPU. The
same rule on the pipeline models (the Hugging Face ones too): 4 threads with their own handles and streams run
the greedy loop, and every token sequence equals the serial one.

How the checks keep themselves honest (a test bug must not pass for a backend bug, nor the reverse):

* Inputs are small integers, so every output and its sum are exact; the expected value is computed once.
* Before each run, NaN-filled blocks of the output's size are handed back to the CUDA caching allocator
  (on the caller's stream) and to the pinned-host allocator, so unfinished output memory reads as NaN, not
  as the previous run's correct result that happened to live at the same address.
* Every output, and every tensor used on another stream, is kept alive until the end of the test (and
  ``record_stream``-ed), so no allocator reuse across streams can corrupt what is read.
* The consumer reads on a fresh stream (CUDA outputs) or on the host (CPU outputs), and synchronises only
  that stream: nothing in the check orders it after the caller's stream.

Rules read ``streams_threads/<rule>``. Programs: the zoo's ``add_mul`` (x*y+z) and ``add`` (x+y), float32,
lowered for each target, plus a two-method program of the same two (``mul_add``, ``plus``): two compiles per
target for a backend that caches artifacts by content.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pytest
import torch
from torch import nn

from conformance.common.checks import assert_exact, fail
from conformance.common.parts import LoweringRuntimeBackend, require_part, skip_reason
from conformance.common.pipelines import PIPELINE_MODELS, pipeline_params, run_greedy
from conformance.common.programs import SKIP_COPY_OPTION, handles, lowered, option, require_lowering_device
from conformance.common.rules import rule_id
from conformance.models import get_model
from conformance.protocol import LoweringBackend
from harness import stream_hold

DTYPE = torch.float32

# The rules this module checks (conformance/catalogue/rule_table.py).
OTHER_CONSUMER = rule_id("streams_threads/other-consumer")
CHAINED_DELEGATES = rule_id("streams_threads/chained-delegates")
THREADS = rule_id("streams_threads/threads")

CONSUMER_RUNS = 100
CHAIN_RUNS = 50
HOLD_S = 0.025
"""How long the caller's stream is held before each run (a front-end hold ends sooner, once the consumer has
read): far longer than the method itself or a lazy backend's return; a backend that waits for the stream
inside ``execute``, as a correct one must, waits this long."""
POISON_BLOCKS = 8
THREAD_TIMEOUT_S = {"cpu": 120.0, "cuda": 300.0}
CHAIN_METHODS = {"mul_add": "add_mul", "plus": "add"}
"""The two-method program: method name → zoo model."""


# ------------------------------------------------------------------------------------------------ helpers


@dataclass(frozen=True)
class Method:
    """One method of one program, with the eager module it was lowered from."""

    program: bytes
    name: str
    module: nn.Module
    example: tuple[torch.Tensor, ...]


def zoo_method(runtime: LoweringBackend, model: str, device: str) -> Method:
    """The zoo model's single method ``forward``, lowered alone for ``device``."""
    lm = lowered(runtime, model, DTYPE, device)
    module, example = lm.eager["forward"]
    return Method(lm.program, "forward", module, example)


@contextlib.contextmanager
def switching_often() -> Iterator[None]:
    """Let the interpreter switch threads every microsecond instead of every 5 ms while the threads run: a
    race between a backend's Python-level steps (stage into a shared buffer, then run) then shows in every
    run instead of once in a while (the measured detection rates are in the README)."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


@functools.cache
def _two_method_program(
    backend: LoweringBackend, device: str
) -> tuple[bytes, dict[str, tuple[nn.Module, tuple]]]:
    eager = {
        name: get_model(model).build(DTYPE, torch.device(device))["forward"]
        for name, model in CHAIN_METHODS.items()
    }
    return backend.lower(eager, device=device), eager


def program_method(runtime: LoweringBackend, name: str, device: str) -> Method:
    """Method ``name`` of the two-method program ``{"mul_add": x*y+z, "plus": x+y}`` for ``device``."""
    data, eager = _two_method_program(runtime, device)
    module, example = eager[name]
    return Method(data, name, module, example)


def exact_inputs(method: Method, device: str | torch.device, seed: int) -> list[torch.Tensor]:
    """Small integers in the method's input shapes and dtypes: x*y+z and x+y are exact on them."""
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randint(-8, 9, tuple(t.shape), generator=gen).to(device=device, dtype=t.dtype)
        for t in method.example
    ]


def eager_outputs(method: Method, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The eager module's outputs in float64 on the CPU, rounded once to the program's dtype."""
    reference = copy.deepcopy(method.module).to(device="cpu", dtype=torch.float64)
    with torch.no_grad():
        result = reference(*(t.detach().cpu().double() for t in inputs))
    outs = list(result) if isinstance(result, (tuple, list)) else [result]
    return [o.to(DTYPE) for o in outs]


def describe(tensors: Sequence[torch.Tensor]) -> str:
    return (
        "["
        + ", ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)} on {t.device}" for t in tensors)
        + "]"
    )


def poison_allocators(like: torch.Tensor, device: torch.device) -> None:
    """Return NaN-filled blocks of ``like``'s size to the CUDA caching allocator (on the current stream) and
    to the pinned-host allocator: output memory a backend has not finished writing then reads as NaN."""
    junk = [
        torch.full(like.shape, float("nan"), dtype=like.dtype, device=device) for _ in range(POISON_BLOCKS)
    ]
    pinned = [
        torch.empty(like.shape, dtype=like.dtype, pin_memory=True).fill_(float("nan"))
        for _ in range(POISON_BLOCKS)
    ]
    del junk, pinned


def consume(out: torch.Tensor, kept: list[torch.Tensor]) -> float:
    """What a consumer reads right after execute returned: the float64 sum of ``out``, computed on a fresh
    CUDA stream (a CUDA output) or on the host (a CPU output), waiting for nothing else."""
    if out.device.type != "cuda":
        return float(out.sum(dtype=torch.float64).item())
    consumer = torch.cuda.Stream(device=out.device)
    with torch.cuda.stream(consumer):
        total = out.sum(dtype=torch.float64)
        value = float(total.item())  # copies and synchronises on the consumer stream only
    out.record_stream(consumer)
    kept.extend((out, total))
    return value


def first_mismatches(sums: list[float], expected: float, limit: int = 5) -> str:
    bad = [(run, s) for run, s in enumerate(sums) if s != expected]
    shown = ", ".join(f"run {run}: {s!r}" for run, s in bad[:limit])
    return f"{len(bad)} of {len(sums)} runs differ from the exact sum {expected!r} ({shown})"


# ------------------------------------------------------------------------------- consumer on another stream


@pytest.mark.rules(OTHER_CONSUMER)
@pytest.mark.gpu
@pytest.mark.parametrize("caller_stream", ["default-stream", "side-stream"])
@pytest.mark.parametrize("inputs_on", ["cpu", "gpu"])
@pytest.mark.parametrize("skip_copy", ["on", "off"])
def test_consumer_on_another_stream_reads_finished_outputs(
    runtime: LoweringRuntimeBackend, skip_copy: str, inputs_on: str, caller_stream: str
) -> None:
    """streams_threads/other-consumer (#21727): with the caller's current stream held before each execute
    (``HOLD_S``; a front-end hold until the consumer has read), a consumer on a fresh stream summing the
    output as soon as execute returns reads the exact sum, 100 runs in a row — outputs on the GPU (skip-copy
    on) or copied to the CPU (off)."""
    rule = OTHER_CONSUMER
    if skip_copy == "on":
        require_part(runtime, "runtime_options")  # outputs stay on the GPU through the runtime option
    device = torch.device("cuda", torch.cuda.current_device())
    method = zoo_method(runtime, "add_mul", "cuda")
    inputs = exact_inputs(method, device if inputs_on == "gpu" else "cpu", seed=1)
    expected = eager_outputs(method, inputs)[0]
    expected_sum = float(expected.double().sum())
    want_device = "cuda" if skip_copy == "on" else "cpu"
    caller = (
        torch.cuda.Stream(device) if caller_stream == "side-stream" else torch.cuda.default_stream(device)
    )
    call = (
        f"execute(add_mul handle, {describe(inputs)}) on the caller's {caller_stream}, held "
        f"{HOLD_S * 1e3:.0f} ms first, skip-copy {skip_copy}; sum on a fresh stream"
    )
    kept: list[torch.Tensor] = [*inputs]
    sums: list[float] = []
    torch.cuda.synchronize(device)
    with (
        option(runtime, SKIP_COPY_OPTION, method.name if skip_copy == "on" else ""),
        handles(runtime, method.program, method.name) as (handle,),
        torch.cuda.stream(caller),
    ):
        first = runtime.execute(handle, inputs)
        torch.cuda.synchronize(device)
        assert_exact(rule, f"serial {call}", first[0].cpu(), expected)
        if first[0].device.type != want_device:
            fail(
                rule,
                call,
                f"with skip-copy {skip_copy} the output must be on {want_device}, got {first[0].device}",
            )
        for _ in range(CONSUMER_RUNS):
            poison_allocators(expected, device)
            with stream_hold.held(caller, HOLD_S):
                outs = runtime.execute(handle, inputs)
                sums.append(consume(outs[0], kept))
            kept.extend(outs)
        torch.cuda.synchronize(device)
    if any(s != expected_sum for s in sums):
        fail(rule, call, "the consumer read unfinished outputs: " + first_mismatches(sums, expected_sum))


# ----------------------------------------------------------------------------------------- chained delegates

CHAIN_TARGETS = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]


@pytest.mark.rules(CHAINED_DELEGATES)
@pytest.mark.parametrize("target", CHAIN_TARGETS)
@pytest.mark.parametrize("chain", ["two-programs", "two-methods"])
def test_chained_delegates_see_each_others_results(
    runtime: LoweringRuntimeBackend, chain: str, target: str
) -> None:
    """streams_threads/chained-delegates (#22318): ``mid = x*y+z`` from one handle, kept on the GPU by the
    skip-copy option, fed with ``w`` into a second handle (another program, or another method of the same
    program) right away; 50 runs, each with the caller's stream held first (``HOLD_S``; a front-end hold
    until the sum is read), give one and the same exact sum.
    two-programs: both methods are ``forward``, so both outputs stay on the GPU and the sum is read on a fresh
    stream; two-methods: only ``mul_add`` is named, so the final output is copied to the CPU. On a CPU target
    the same chain checks the data path only (no streams)."""
    rule = CHAINED_DELEGATES
    on_gpu = target == "cuda"
    if on_gpu:
        require_part(runtime, "runtime_options")  # mid stays on the GPU through the runtime option
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    if chain == "two-programs":
        first, second = zoo_method(runtime, "add_mul", target), zoo_method(runtime, "add", target)
        skip = "forward"
    else:
        first, second = program_method(runtime, "mul_add", target), program_method(runtime, "plus", target)
        skip = "mul_add"
    xyz = exact_inputs(first, "cpu", seed=2)
    w = exact_inputs(second, device, seed=3)[1]
    mid_expected = eager_outputs(first, xyz)[0]
    expected = eager_outputs(second, [mid_expected, w])[0]
    expected_sum = float(expected.double().sum())
    call = f"execute({first.name}, {describe(xyz)}) → mid on {device.type} → execute({second.name}, [mid, w])"
    kept: list[torch.Tensor] = [*xyz, w]
    sums: list[float] = []
    if on_gpu:
        torch.cuda.synchronize(device)
    if skip_reason(runtime, "runtime_options"):
        skip = ""  # a CPU target, and a backend without options: the data path alone
    with (
        option(runtime, SKIP_COPY_OPTION, skip),
        handles(runtime, first.program, first.name) as (h1,),
        handles(runtime, second.program, second.name) as (h2,),
    ):
        mid = runtime.execute(h1, xyz)[0]
        if mid.device.type != device.type:
            fail(
                rule,
                call,
                f"{first.name!r} is named in the skip-copy option, so its output must stay on {device.type} "
                f"to be fed to the next delegate there; got {mid.device}",
            )
        final = runtime.execute(h2, [mid, w])[0]
        if on_gpu:
            torch.cuda.synchronize(device)
        assert_exact(rule, f"serial {call}", mid.cpu(), mid_expected)
        assert_exact(rule, f"serial {call}", final.cpu(), expected)
        caller = torch.cuda.current_stream(device) if on_gpu else None
        for _ in range(CHAIN_RUNS):
            if on_gpu:
                poison_allocators(mid_expected, device)
            with stream_hold.held(caller, HOLD_S) if caller else contextlib.nullcontext():
                mid = runtime.execute(h1, xyz)[0]
                final = runtime.execute(h2, [mid, w])[0]
                sums.append(consume(final, kept))
            kept.extend((mid, final))
        if on_gpu:
            torch.cuda.synchronize(device)
    distinct = sorted(set(sums))
    if distinct != [expected_sum]:
        fail(
            rule,
            call,
            f"{len(distinct)} different sums in {CHAIN_RUNS} runs (ordering between delegates is lost): "
            + first_mismatches(sums, expected_sum),
        )


# --------------------------------------------------------------------------------------------------- threads

THREAD_CASES = [
    pytest.param("cpu", 4, 50, id="cpu-4x50"),
    pytest.param("cuda", 8, 200, id="cuda-8x200", marks=pytest.mark.gpu),
]
OPTION_VALUES = ("forward", "", " forward , other", "other", "forward,forward")
"""What the flipping thread cycles the skip-copy option through (every handle here is method ``forward``)."""


@dataclass
class Job:
    """What one worker thread executes, the serial result it must get every time (``serial``, copied to
    the CPU) and that serial execute's outputs as returned (which no later execute may write)."""

    handle: object
    inputs: list[torch.Tensor]
    serial: list[torch.Tensor]
    returned: list[torch.Tensor]


@dataclass
class Tally:
    """What the racing threads saw, per worker thread: results that differed from the serial one, earlier
    outputs a later execute changed, executes that returned GPU outputs; and errors, and option flips."""

    mismatches: list[int]
    overwritten: list[int]
    on_device: list[int]
    errors: list[str] = field(default_factory=list)
    flips: int = 0


@pytest.mark.rules(THREADS)
@pytest.mark.parametrize(("target", "threads", "iterations"), THREAD_CASES)
@pytest.mark.parametrize("sharing", ["one-handle", "own-handles"])
def test_threads_match_serial_while_options_flip(
    runtime: LoweringRuntimeBackend, sharing: str, target: str, threads: int, iterations: int
) -> None:
    """streams_threads/threads: N threads executing one handle (or each its own handle, of two programs) with
    per-thread inputs, while another thread flips the skip-copy option (for a backend with runtime
    options; without, the threads alone): every result, moved to the CPU, equals the serial result; no
    exception; every thread finishes (else: deadlock)."""
    rule = THREADS
    flipping_options = not skip_reason(runtime, "runtime_options")
    on_gpu = target == "cuda"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    models = ["add_mul"] if sharing == "one-handle" else ["add_mul", "add"]
    methods = [zoo_method(runtime, model, target) for model in models]
    call = f"{threads} threads × {iterations} executes on {sharing} ({target})"
    call += " while set_option flips" if flipping_options else " (the backend has no runtime options)"
    with contextlib.ExitStack() as stack:
        stack.enter_context(option(runtime, SKIP_COPY_OPTION, ""))
        jobs = serial_jobs(runtime, stack, methods, sharing, threads, device)
        check_serial_outputs_kept(jobs, call)
        if on_gpu:
            torch.cuda.synchronize(device)
        tally = Tally([0] * threads, [0] * threads, [0] * threads)
        stuck, flipper_stuck = race(runtime, jobs, iterations, target, device, flipping_options, tally)
        if stuck or flipper_stuck:
            stack.pop_all()  # no destroy or set_option now: they could block behind the stuck threads
            who = f"threads {stuck}" + (" and the option thread" if flipper_stuck else "")
            fail(rule, call, f"deadlock: {who} still running after {THREAD_TIMEOUT_S[target]:.0f} s")
    errors = tally.errors
    if errors:
        fail(rule, call, "; ".join(errors[:5]) + (f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""))
    if any(tally.mismatches) or any(tally.overwritten):
        fail(
            rule,
            call,
            f"results differ from the serial result (mismatches per thread: {tally.mismatches}; earlier "
            f"outputs changed by a later execute, per thread: {tally.overwritten}; outputs on the GPU per "
            f"thread: {tally.on_device}; option flips: {tally.flips})",
        )


def serial_jobs(
    runtime: LoweringRuntimeBackend,
    stack: contextlib.ExitStack,
    methods: Sequence[Method],
    sharing: str,
    threads: int,
    device: torch.device,
) -> list[Job]:
    """One job per thread, each on inputs of its own, executed once serially (its handle: the one shared
    handle, or its own, opened on ``stack``); every serial result must be eager's, exactly."""
    on_gpu = device.type == "cuda"
    if sharing == "one-handle":
        (shared,) = stack.enter_context(handles(runtime, methods[0].program, "forward"))
    jobs: list[Job] = []
    for i in range(threads):
        method = methods[i % len(methods)]
        # On a GPU, every other pair of threads passes device inputs (used in place), the rest CPU inputs.
        where = device if on_gpu and (i // 2) % 2 else "cpu"
        inputs = exact_inputs(method, where, seed=100 + i)
        if sharing == "one-handle":
            handle = shared
        else:
            (handle,) = stack.enter_context(handles(runtime, method.program, "forward"))
        returned = runtime.execute(handle, inputs)
        serial = [o.cpu().clone() for o in returned]
        for got, want in zip(serial, eager_outputs(method, inputs), strict=True):
            assert_exact(THREADS, f"serial execute of thread {i}'s inputs", got, want)
        jobs.append(Job(handle, inputs, serial, list(returned)))
    return jobs


def check_serial_outputs_kept(jobs: Sequence[Job], call: str) -> None:
    """Outputs belong to the caller: the serial executes of the other threads' inputs (on this handle or
    others) must not have written what an earlier one returned. Checked before any thread starts, so a
    runtime that hands every caller one buffer fails here deterministically, not only by a race."""
    for i, job in enumerate(jobs):
        if not all(torch.equal(o.cpu(), s) for o, s in zip(job.returned, job.serial, strict=False)):
            fail(
                THREADS,
                call,
                f"the outputs the serial execute of thread {i}'s inputs returned changed when the other "
                "threads' inputs were executed after it (outputs belong to the caller)",
            )


def race(
    runtime: LoweringRuntimeBackend,
    jobs: Sequence[Job],
    iterations: int,
    target: str,
    device: torch.device,
    flipping_options: bool,
    tally: Tally,
) -> tuple[list[int], bool]:
    """Every job executed ``iterations`` times in a thread of its own (on a GPU, on a CUDA stream of its
    own), all starting together, while an option thread flips the skip-copy option (or, without runtime
    options, only waits); what they see goes to ``tally``. Returns the worker threads still running at the
    deadline, and whether the option thread is."""
    on_gpu = device.type == "cuda"
    stop = threading.Event()
    start = threading.Barrier(len(jobs))

    def worker(i: int) -> None:
        streams = torch.cuda.stream(torch.cuda.Stream(device)) if on_gpu else contextlib.nullcontext()
        try:
            start.wait()
            with streams:
                execute_repeatedly(runtime, jobs[i], i, iterations, tally)
        except Exception as exc:  # reported by the test with the thread index
            tally.errors.append(f"thread {i}: {type(exc).__name__}: {exc}")

    def flipper() -> None:
        try:
            while not stop.is_set():
                runtime.set_option(SKIP_COPY_OPTION, OPTION_VALUES[tally.flips % len(OPTION_VALUES)])  # type: ignore[attr-defined]
                tally.flips += 1
                time.sleep(0.0002)
        except Exception as exc:  # reported by the test
            tally.errors.append(f"option thread: {type(exc).__name__}: {exc}")

    pool = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(len(jobs))]
    flipping = threading.Thread(target=flipper if flipping_options else stop.wait, daemon=True)
    with switching_often():
        flipping.start()
        for t in pool:
            t.start()
        deadline = time.monotonic() + THREAD_TIMEOUT_S[target]
        for t in pool:
            t.join(max(0.0, deadline - time.monotonic()))
        stop.set()
        flipping.join(10.0)
    return [i for i, t in enumerate(pool) if t.is_alive()], flipping.is_alive()


def execute_repeatedly(
    runtime: LoweringRuntimeBackend, job: Job, i: int, iterations: int, tally: Tally
) -> None:
    """Thread ``i``'s executes of its job, each result compared with the serial one, and the previous
    execute's outputs with what they held."""
    held: list[torch.Tensor] = []  # the previous execute's outputs, as returned
    for _ in range(iterations):
        outs = runtime.execute(job.handle, job.inputs)
        tally.on_device[i] += any(o.device.type == "cuda" for o in outs)
        got = [o.cpu() for o in outs]
        if len(got) != len(job.serial) or not all(
            torch.equal(g, s) for g, s in zip(got, job.serial, strict=False)
        ):
            tally.mismatches[i] += 1
        # Outputs belong to the caller: no later execute, of any thread, may write them.
        if held and not all(torch.equal(h.cpu(), s) for h, s in zip(held, job.serial, strict=False)):
            tally.overwritten[i] += 1
        held = list(outs)


#: Threads and greedy runs each for the pipeline models: each run is 6-8 steps of two methods.
PIPELINE_THREADS, PIPELINE_RUNS = 4, 3


@pytest.mark.rules(THREADS)
@pytest.mark.parametrize("target", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("model", pipeline_params())
def test_pipeline_models_from_threads_match_serial(
    runtime: LoweringRuntimeBackend, model: str, target: str
) -> None:
    """streams_threads/threads on the pipeline models (``asr``, ``llm`` and, with ``transformers``, the
    Hugging Face ``hf_whisper`` and ``hf_llm``): 4 threads, each with its own handles of one float32 program
    (and, on a GPU, its own CUDA stream), run the model's greedy loop 3 times; every token sequence equals the
    serial one, no exception, no deadlock."""
    rule = THREADS
    require_lowering_device(runtime, target)
    lm = lowered(runtime, model, DTYPE, target)
    first, _ = PIPELINE_MODELS[model].methods
    first_input = lm.eager[first][1][0].detach().cpu()
    call = f"{PIPELINE_THREADS} threads × {PIPELINE_RUNS} greedy runs of {model} ({target}), own handles"
    on_gpu = target == "cuda"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else None
    with contextlib.ExitStack() as stack:
        made = [
            stack.enter_context(handles(runtime, lm.program, *lm.methods)) for _ in range(PIPELINE_THREADS)
        ]
        serial = run_greedy(runtime, model, made[0][0], made[0][1], first_input)
        errors: list[str] = []
        differing: list[int] = [0] * PIPELINE_THREADS

        def worker(i: int) -> None:
            streams = torch.cuda.stream(torch.cuda.Stream(device)) if on_gpu else contextlib.nullcontext()
            try:
                with streams:
                    for _ in range(PIPELINE_RUNS):
                        got = run_greedy(runtime, model, made[i][0], made[i][1], first_input)
                        differing[i] += not torch.equal(got, serial)
            except Exception as exc:  # reported below with the thread index
                errors.append(f"thread {i}: {type(exc).__name__}: {exc}")

        pool = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(PIPELINE_THREADS)]
        with switching_often():
            for t in pool:
                t.start()
            deadline = time.monotonic() + THREAD_TIMEOUT_S[target]
            for t in pool:
                t.join(max(0.0, deadline - time.monotonic()))
        stuck = [i for i, t in enumerate(pool) if t.is_alive()]
        if stuck:
            stack.pop_all()  # no destroy now: it could block behind the stuck threads
            fail(
                rule, call, f"deadlock: threads {stuck} still running after {THREAD_TIMEOUT_S[target]:.0f} s"
            )
    if errors:
        fail(rule, call, "; ".join(errors[:5]))
    if any(differing):
        fail(
            rule, call, f"token sequences differ from the serial run (runs differing per thread: {differing})"
        )
