"""Correct backends that differ from the reference where the contract lets them
(``conformance/common/oracle.py``'s ``ALLOWED_DIFFERENCES``): each must pass the differential chapter, which
would otherwise cry wolf at a backend that is merely not ours.
``tests/conformance/test_correct_but_different.py`` runs them; each difference is the other side of a rule's
proof (a broken backend in ``tests/broken/``).
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

import torch

from reference_impl import BACKEND as REFERENCE
from tests.broken.chapter import Forwarding
from tests.rule_coverage import Breaks

#: No rule broken: a ``Breaks`` with no rules is never collected as a broken backend's proof.
_NONE = Breaks((), "conformance/differential/test_differential.py")


class ContractError(ValueError):
    """The backend's own invalid-argument error (a ``ValueError`` subclass, as the protocol welcomes)."""


class OwnErrorsOwnWords(Forwarding):
    """Raises its own ``ValueError`` subclass, worded its own way, for every contract violation (still
    naming the argument), where the reference raises its own classes."""

    def __getattr__(self, attr: str) -> Any:
        target = getattr(REFERENCE, attr)
        if attr not in ("init", "execute", "destroy", "execute_stats", "set_option", "get_option", "lower"):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return target(*args, **kwargs)
            except ValueError as exc:
                raise ContractError(f"{attr}: rejected ({exc})") from None

        return call


class ReturnsColumnMajorResults(Forwarding):
    """Returns every rank-2-or-more result laid out column-major: the same values, other strides."""

    def execute(self, handle: Any, inputs: Any, outputs: Any = None) -> list[torch.Tensor]:
        results = REFERENCE.execute(handle, inputs, outputs)
        if outputs is not None:
            return results
        return [t.transpose(-1, -2).contiguous().transpose(-1, -2) if t.dim() >= 2 else t for t in results]


class StatsAsAReadOnlyMapping(Forwarding):
    """Returns the counters as a read-only mapping (``types.MappingProxyType``), not a dict."""

    def execute_stats(self, handle: Any) -> Mapping[str, int]:
        return types.MappingProxyType(dict(REFERENCE.execute_stats(handle)))


class ReturnsCopiesOfProvidedOutputs(Forwarding):
    """Fills ``outputs=`` and returns copies of them, not the caller's tensors themselves."""

    def execute(self, handle: Any, inputs: Any, outputs: Any = None) -> list[torch.Tensor]:
        results = REFERENCE.execute(handle, inputs, outputs)
        return [t.clone() for t in results] if outputs is not None else results


OWN_ERRORS_OWN_WORDS = OwnErrorsOwnWords("own-errors-own-words", _NONE)
RETURNS_COLUMN_MAJOR_RESULTS = ReturnsColumnMajorResults("returns-column-major-results", _NONE)
STATS_AS_A_READ_ONLY_MAPPING = StatsAsAReadOnlyMapping("stats-as-a-read-only-mapping", _NONE)
RETURNS_COPIES_OF_PROVIDED_OUTPUTS = ReturnsCopiesOfProvidedOutputs(
    "returns-copies-of-provided-outputs", _NONE
)

#: Every correct-but-different backend, as ``--backend`` takes it.
DIFFERENT: tuple[str, ...] = tuple(
    f"{__name__}:{name}" for name, value in list(vars().items()) if isinstance(value, Forwarding)
)
