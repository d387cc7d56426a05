"""Broken backends whose slips no list of bad inputs names: each differs from the reference only in
something a caller can pass or observe that the contract fixes. The differential chapter must find each
because it derives its calls from the protocol's signatures and compares everything a caller sees
(``conformance/common/contract_surface.py``, ``conformance/common/observed.py``), not because a rule was
written for it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import torch

from reference_impl import BACKEND as REFERENCE
from tests.broken.chapter import Forwarding
from tests.broken.generated import DIFFERENTIAL, PROTOCOL_CPU, PROTOCOL_CUDA
from tests.rule_coverage import Breaks

#: The exhaustive round: every argument once (no Hypothesis, nothing to shrink).
EVERY_ARGUMENT_CPU = ("-k", "every_argument and cpu")


class StatsOfTheLastExecuteAnywhere(Forwarding):
    """Keeps one set of byte counters for the whole backend: ``execute_stats(handle)`` answers with the last
    execute of *any* handle."""

    def __init__(self, name: str, breaks: Breaks) -> None:
        super().__init__(name, breaks)
        self._last: dict[str, int] | None = None

    def execute(self, handle: Any, inputs: Any, outputs: Any = None) -> list[torch.Tensor]:
        results = REFERENCE.execute(handle, inputs, outputs)
        self._last = dict(REFERENCE.execute_stats(handle))
        return results

    def execute_stats(self, handle: Any) -> Mapping[str, int]:
        stats = REFERENCE.execute_stats(handle)  # a destroyed handle still raises
        return dict(self._last) if self._last is not None else stats


class CachesByInputAddress(Forwarding):
    """Memoises results by the inputs' addresses and shapes ("the same buffers, the same answer"): a caller
    that refills its input buffers in place gets the old results."""

    def __init__(self, name: str, breaks: Breaks) -> None:
        super().__init__(name, breaks)
        self._memo: dict[tuple, list[torch.Tensor]] = {}

    def execute(self, handle: Any, inputs: Any, outputs: Any = None) -> list[torch.Tensor]:
        if outputs is not None or not isinstance(inputs, (list, tuple)):
            return REFERENCE.execute(handle, inputs, outputs)
        if not all(isinstance(t, torch.Tensor) and t.layout == torch.strided for t in inputs):
            return REFERENCE.execute(handle, inputs, outputs)
        key = (id(handle), *((t.data_ptr(), tuple(t.shape), t.dtype, t.device) for t in inputs))
        if key not in self._memo:
            self._memo[key] = REFERENCE.execute(handle, inputs)
        return [t.clone() for t in self._memo[key]]


class OptionsPerThread(Forwarding):
    """Keeps the options in thread-local storage ("no lock needed"): another thread reads the default."""

    def __init__(self, name: str, breaks: Breaks) -> None:
        super().__init__(name, breaks)
        self._local = threading.local()

    def set_option(self, key: Any, value: Any) -> None:
        REFERENCE.set_option(key, value)
        self._local.seen = True

    def get_option(self, key: Any) -> Any:
        value = REFERENCE.get_option(key)
        return value if getattr(self._local, "seen", False) else ""


class ResultsRequireGrad(Forwarding):
    """Returns results that require grad (made with autograd on): a caller's in-place write of a result
    raises, and every later use records a graph."""

    def execute(self, handle: Any, inputs: Any, outputs: Any = None) -> list[torch.Tensor]:
        results = REFERENCE.execute(handle, inputs, outputs)
        if outputs is not None:
            return results
        return [t.requires_grad_(True) if t.is_floating_point() else t for t in results]


class CountsOptionLimitsInBytes(Forwarding):
    """Checks the option's 255-character limit on its UTF-8 encoding (a C buffer's size): a value of 200
    ``é`` (200 characters, 400 bytes) is refused."""

    def set_option(self, key: Any, value: Any) -> None:
        if isinstance(value, str) and len(value.encode()) > 255 and len(value) <= 255:
            raise ValueError(f"value: option values are limited to 255 bytes, got {len(value.encode())}")
        REFERENCE.set_option(key, value)


class AcceptsAnyHandle(Forwarding):
    """``execute_stats`` of something that is no handle returns zeros ("nothing ran yet")."""

    def execute_stats(self, handle: Any) -> Mapping[str, int]:
        if not hasattr(handle, "method_name"):
            return {"h2d_bytes": 0, "d2h_bytes": 0}
        return REFERENCE.execute_stats(handle)


class ReusesTheResultList(Forwarding):
    """Returns one list per handle, cleared and refilled on every execute: the list a caller holds from
    the previous call now holds the new results."""

    def __init__(self, name: str, breaks: Breaks) -> None:
        super().__init__(name, breaks)
        self._lists: dict[int, list[torch.Tensor]] = {}

    def execute(self, handle: Any, inputs: Any, outputs: Any = None) -> list[torch.Tensor]:
        results = REFERENCE.execute(handle, inputs, outputs)
        kept = self._lists.setdefault(id(handle), [])
        kept[:] = results
        return kept


#: Only a CUDA target copies bytes: on the host every counter is 0, so nothing there can tell.
STATS_OF_THE_LAST_EXECUTE_ANYWHERE = StatsOfTheLastExecuteAnywhere(
    "stats-of-the-last-execute-anywhere",
    Breaks(
        ("differential/counters",),
        DIFFERENTIAL,
        PROTOCOL_CUDA,
        cuda=True,
    ),
)
CACHES_BY_INPUT_ADDRESS = CachesByInputAddress(
    "caches-by-input-address", Breaks(("differential/values",), DIFFERENTIAL, PROTOCOL_CPU)
)
OPTIONS_PER_THREAD = OptionsPerThread(
    "options-per-thread",
    Breaks(("differential/option-read-back",), DIFFERENTIAL, ("-k", "option_calls", "--generated-no-shrink")),
)
RESULTS_REQUIRE_GRAD = ResultsRequireGrad(
    "results-require-grad", Breaks(("differential/result-structure",), DIFFERENTIAL, EVERY_ARGUMENT_CPU)
)
COUNTS_OPTION_LIMITS_IN_BYTES = CountsOptionLimitsInBytes(
    "counts-option-limits-in-bytes",
    Breaks(("differential/spurious-error",), DIFFERENTIAL, EVERY_ARGUMENT_CPU),
)
ACCEPTS_ANY_HANDLE = AcceptsAnyHandle(
    "accepts-any-handle", Breaks(("differential/missing-error",), DIFFERENTIAL, EVERY_ARGUMENT_CPU)
)
REUSES_THE_RESULT_LIST = ReusesTheResultList(
    "reuses-the-result-list", Breaks(("differential/outputs-owned",), DIFFERENTIAL, PROTOCOL_CPU)
)
