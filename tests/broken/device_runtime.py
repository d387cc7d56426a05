"""Broken backends for the runtime rules only a GPU can show: devices of inputs and outputs that do not
match the program (another GPU's among them), a CPU program on a CUDA machine, and stream ordering
(upstream's #21727 and #22318). Each wraps the reference and slips the way a real runtime does; the
self-tests skip them without CUDA (or with one GPU, the cross-GPU one), ``.ci/gpu/followup.sh`` runs them
on the GPU machine.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from reference_impl import BACKEND as REFERENCE
from tests.broken.chapter import BAD_INPUTS, PROGRAM_FORMAT, STREAMS_THREADS, Forwarding
from tests.rule_coverage import Breaks


class MovesInputsToTheProgram(Forwarding):
    """Moves every input to the program's device before running, "to be helpful": a CUDA tensor handed to a
    CPU program is copied back silently, so a caller who meant to keep data on the GPU never learns it
    paid a device-to-host copy (breaks ``bad_inputs/wrong-device``)."""

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        moved = [t.to(handle.device) if isinstance(t, torch.Tensor) else t for t in inputs]
        return REFERENCE.execute(handle, moved, outputs)


class CopiesIntoAnyOutputs(Forwarding):
    """Fills caller-provided outputs wherever they live: results are computed as usual and ``copy_``-ed into
    the given tensors, so CUDA outputs are accepted where the outputs go to the CPU, at the cost of a copy
    the caller did not ask for (breaks ``bad_inputs/outputs-wrong-device``)."""

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        if outputs is None or all(t.device.type == "cpu" for t in outputs):
            return REFERENCE.execute(handle, inputs, outputs)
        result = REFERENCE.execute(handle, inputs)
        for given, got in zip(outputs, result, strict=True):
            given.copy_(got)
        return list(outputs)


class KeepsOutputsOnTheGpuForAnyTarget(Forwarding):
    """Reads the skip-copy option as "return these methods' outputs on the GPU", whatever the program was
    lowered for: a CPU program's outputs are moved to CUDA when the option names its method (breaks
    ``program_format/cpu-target``: a CPU program's outputs are CPU tensors)."""

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        from reference_impl.runtime.options import skip_copy_methods

        result = REFERENCE.execute(handle, inputs, outputs)
        if (
            handle.device.type == "cpu"
            and handle.method_name in skip_copy_methods()
            and torch.cuda.is_available()
        ):
            return [t.to("cuda") for t in result]
        return result


class ReturnsBeforeTheWorkIsDone(Forwarding):
    """Hands back the output buffers at once and runs the method on a worker thread that fills them later
    (a "non-blocking" execute): a consumer on another stream reads them unfinished (upstream's #21727), and
    a second delegate fed with them computes on garbage (#22318). A handle's first execute runs inline,
    to learn the output shapes, so a single serial call looks right."""

    _shapes: ClassVar[dict[int, list[tuple[torch.Size, torch.dtype]]]] = {}
    _workers: ClassVar[dict[int, list[threading.Thread]]] = {}

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        shapes = self._shapes.get(id(handle))
        if handle.device.type != "cuda" or outputs is not None or shapes is None:
            result = REFERENCE.execute(handle, inputs, outputs)
            if all(t.device.type == "cuda" for t in result):
                self._shapes[id(handle)] = [(t.shape, t.dtype) for t in result]
            return result
        caller = torch.cuda.current_stream(handle.device)
        arena = [torch.empty(shape, dtype=dtype, device=handle.device) for shape, dtype in shapes]

        def fill() -> None:
            with torch.cuda.stream(caller):
                for dst, src in zip(arena, REFERENCE.execute(handle, list(inputs)), strict=True):
                    dst.copy_(src)
                caller.synchronize()

        worker = threading.Thread(target=fill, daemon=True)
        worker.start()
        self._workers.setdefault(id(handle), []).append(worker)
        return arena

    def destroy(self, handle: object) -> None:
        for worker in self._workers.pop(id(handle), []):
            worker.join()
        REFERENCE.destroy(handle)


# ========================================================================================= declarations

MOVES_INPUTS_TO_THE_PROGRAM = MovesInputsToTheProgram(
    "moves-inputs-to-the-program",
    Breaks(("bad_inputs/wrong-device",), BAD_INPUTS, ("-k", "cuda_tensor_to_cpu_program"), cuda=True),
)
# The same slip across GPUs: an input on cuda:1 is pulled over to the program's cuda:0 by a peer copy.
MOVES_INPUTS_ACROSS_GPUS = MovesInputsToTheProgram(
    "moves-inputs-to-the-program",
    Breaks(("bad_inputs/other-gpu",), BAD_INPUTS, ("-k", "tensor_on_another_gpu"), cuda=True, gpus=2),
)
COPIES_INTO_ANY_OUTPUTS = CopiesIntoAnyOutputs(
    "copies-into-any-outputs",
    Breaks(
        ("bad_inputs/outputs-wrong-device",),
        BAD_INPUTS,
        ("-k", "cuda_outputs_where_outputs_go_to_the_cpu"),
        cuda=True,
    ),
)
KEEPS_OUTPUTS_ON_THE_GPU_FOR_ANY_TARGET = KeepsOutputsOnTheGpuForAnyTarget(
    "keeps-outputs-on-the-gpu-for-any-target",
    Breaks(
        ("program_format/cpu-target",),
        PROGRAM_FORMAT,
        ("-k", "cpu_program_on_a_cuda_machine and names-the-method"),
        cuda=True,
    ),
)
RETURNS_EARLY_CONSUMER = ReturnsBeforeTheWorkIsDone(
    "returns-before-the-work-is-done",
    Breaks(
        ("streams_threads/other-consumer",),
        STREAMS_THREADS,
        ("-k", "consumer_on_another_stream and on-gpu-default-stream"),
        cuda=True,
    ),
)
RETURNS_EARLY_CHAIN = ReturnsBeforeTheWorkIsDone(
    "returns-before-the-work-is-done",
    Breaks(
        ("streams_threads/chained-delegates",),
        STREAMS_THREADS,
        ("-k", "chained_delegates and two-programs-cuda"),
        cuda=True,
    ),
)
