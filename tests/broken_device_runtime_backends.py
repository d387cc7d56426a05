"""Broken backends for the runtime rules only a GPU can show: devices of inputs and outputs that do not
match the program, a CPU program on a CUDA machine, and stream ordering (upstream's #21727 and #22318).
Each wraps the reference and slips the way a real runtime does; the self-tests skip them without CUDA,
``.ci/gpu/followup.sh`` runs them on the GPU machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from conformance.rule_coverage import Breaks
from reference_impl import BACKEND as REFERENCE
from tests.broken_chapter_backends import BAD_INPUTS, PROGRAM_FORMAT, STREAMS_THREADS, Forwarding


class MovesInputsToTheProgram(Forwarding):
    """Moves every input to the program's device before running, "to be helpful": a CUDA tensor handed to a
    CPU program is copied back silently, so a caller who meant to keep data on the GPU never learns it
    paid a device-to-host copy (breaks ``bad-inputs/wrong-device``)."""

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        moved = [t.to(handle.device) if isinstance(t, torch.Tensor) else t for t in inputs]
        return REFERENCE.execute(handle, moved, outputs)


class CopiesIntoAnyOutputs(Forwarding):
    """Fills caller-provided outputs wherever they live: results are computed as usual and ``copy_``-ed into
    the given tensors, so CUDA outputs are accepted where the outputs go to the CPU, at the cost of a copy
    the caller did not ask for (breaks ``bad-inputs/outputs-wrong-device``)."""

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
    ``format/cpu-target``: a CPU program's outputs are CPU tensors)."""

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


class StreamPerHandle(Forwarding):
    """Runs each handle on a stream of its own, ordered after the caller's stream (its inputs may come from
    there) but returning without making the caller wait for it: kept outputs are handed back while their
    kernels are still queued (upstream's #21727), and a second handle fed with them reads them unfinished
    (#22318). Host outputs stay right: their copy waits for the handle's stream."""

    _streams: ClassVar[dict[int, torch.cuda.Stream]] = {}

    def execute(
        self, handle: Any, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        if handle.device.type != "cuda":
            return REFERENCE.execute(handle, inputs, outputs)
        stream = self._streams.setdefault(id(handle), torch.cuda.Stream(handle.device))
        stream.wait_stream(torch.cuda.current_stream(handle.device))
        with torch.cuda.stream(stream):
            return REFERENCE.execute(handle, inputs, outputs)


# ========================================================================================= declarations

MOVES_INPUTS_TO_THE_PROGRAM = MovesInputsToTheProgram(
    "moves-inputs-to-the-program",
    Breaks(("bad-inputs/wrong-device",), BAD_INPUTS, ("-k", "cuda_tensor_to_cpu_program"), cuda=True),
)
COPIES_INTO_ANY_OUTPUTS = CopiesIntoAnyOutputs(
    "copies-into-any-outputs",
    Breaks(
        ("bad-inputs/outputs-wrong-device",),
        BAD_INPUTS,
        ("-k", "cuda_outputs_where_outputs_go_to_the_cpu"),
        cuda=True,
    ),
)
KEEPS_OUTPUTS_ON_THE_GPU_FOR_ANY_TARGET = KeepsOutputsOnTheGpuForAnyTarget(
    "keeps-outputs-on-the-gpu-for-any-target",
    Breaks(
        ("format/cpu-target",),
        PROGRAM_FORMAT,
        ("-k", "cpu_program_on_a_cuda_machine and names-the-method"),
        cuda=True,
    ),
)
STREAM_PER_HANDLE_CONSUMER = StreamPerHandle(
    "stream-per-handle",
    Breaks(
        ("streams/other-consumer",),
        STREAMS_THREADS,
        ("-k", "consumer_on_another_stream and on-gpu-default-stream"),
        cuda=True,
    ),
)
STREAM_PER_HANDLE_CHAIN = StreamPerHandle(
    "stream-per-handle",
    Breaks(
        ("streams/chained-delegates",),
        STREAMS_THREADS,
        ("-k", "chained_delegates and two-programs-cuda"),
        cuda=True,
    ),
)
