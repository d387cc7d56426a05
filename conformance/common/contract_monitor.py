"""The contract monitor: every protocol call any chapter makes on the backend under test passes through one
wrapper that checks, on that call, what the contract states for *every* call (``conformance/protocol.py``):

* ``contract/inputs-untouched`` — no argument the call only reads changed: tensors (bit for bit, and their
  dtype, shape and device), a program's bytes, the modules and example inputs given to ``lower``;
* ``contract/outputs-untouched`` — a call that raised left the tensors it may write (``outputs=`` of
  ``execute``, ``out`` of ``mm_out``) as they were;
* ``contract/results-owned`` — no tensor a call returned shares an element with an argument it only read,
  nor with a tensor an earlier call returned that is still alive (the caller holds it);
* ``contract/result-signature`` — what returned is what the method declares (``lower``: non-empty
  ``bytes``; ``init``: a handle, not None; ``execute``: a ``list`` of tensors; ``execute_stats``: a mapping
  with ``h2d_bytes`` and ``d2h_bytes`` as non-negative ints; ``get_option``: a ``str``; ``destroy``,
  ``set_option`` and ``mm_out``: None);
* ``contract/error-class`` — an exception is one the Errors section allows: ``ValueError`` (a contract
  violation), ``TypeError`` (Python's own, for a call of the wrong shape) or ``RuntimeError`` (the library).

A violation does not change what the call did (the chapter sees the same result or exception); it is noted,
and the case fails under the monitor's rule when it ends (``conformance/conftest.py``), ahead of whatever
the case itself then found, so that a broken invariant is named first and not as a consequence in another
chapter's words. On CUDA the checks never wait for the device: snapshots and comparisons are enqueued on
the caller's current stream, and their verdicts read when the case ends.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from conformance.common.checks import bits
from conformance.common.oracle import describe_args
from conformance.common.rules import rule_id

__all__ = ["RULES", "ContractMonitor", "MonitorFailure", "Violation", "overlaps", "paused", "unwrapped"]

INPUTS_UNTOUCHED = rule_id("contract/inputs-untouched")
OUTPUTS_UNTOUCHED = rule_id("contract/outputs-untouched")
RESULTS_OWNED = rule_id("contract/results-owned")
RESULT_SIGNATURE = rule_id("contract/result-signature")
ERROR_CLASS = rule_id("contract/error-class")
#: Every rule the monitor checks, on every call of every case that asks for the backend.
RULES = (INPUTS_UNTOUCHED, OUTPUTS_UNTOUCHED, RESULTS_OWNED, RESULT_SIGNATURE, ERROR_CLASS)

#: The exception classes the protocol's Errors section allows (subclasses welcome).
ALLOWED_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError, RuntimeError)

#: Protocol method -> its positional parameters' names, as the contract writes them.
PARAMETERS: dict[str, tuple[str, ...]] = {
    "lower": ("methods",),
    "init": ("program", "method"),
    "execute": ("handle", "inputs", "outputs"),
    "destroy": ("handle",),
    "execute_stats": ("handle",),
    "set_option": ("key", "value"),
    "get_option": ("key",),
    "mm_out": ("out", "self", "mat2"),
}
#: The parameters a call may write, on success only.
WRITTEN: dict[str, frozenset[str]] = {"execute": frozenset({"outputs"}), "mm_out": frozenset({"out"})}
#: A tensor this large is compared by its extent, not element by element, in the ownership check.
_EXACT_OVERLAP_LIMIT = 1 << 22
#: Earlier results remembered for the ownership check (the latest ones; dead ones are dropped).
_EARLIER = 256


class MonitorFailure(AssertionError):
    """A case's failure under a monitor rule; ``case_rule``: the rule the case's own check then named."""

    def __init__(self, message: str, case_rule: str | None) -> None:
        super().__init__(message)
        self.case_rule = case_rule

    @classmethod
    def of(cls, found: list[Violation], own: BaseException | None) -> MonitorFailure:
        """The failure for the violations ``found`` during a case that then ended with ``own``."""
        from conformance.common.rules import rule_of

        first, more = found[0], found[1:]
        lines = [first.text() + " (the contract monitor checks this on every call)"]
        if more:
            rules = ", ".join(sorted({v.rule for v in more}))
            lines.append(f"and {len(more)} more violation(s) in this case: {rules}")
        if isinstance(own, AssertionError):  # a check's failure: its text starts with its rule
            own_text = str(own).strip()
        else:
            own_text = f"{type(own).__name__}: {str(own).strip()}" if own is not None else ""
        if own_text:
            lines.append("the case itself then found: " + own_text.splitlines()[0][:600])
        return cls("\n".join(lines), rule_of(own_text) if isinstance(own, AssertionError) else None)


@dataclass(frozen=True)
class Violation:
    rule: str
    call: str
    message: str

    def text(self) -> str:
        return f"[{self.rule}] {self.call}: {self.message}"


@dataclass
class _Watched:
    """A tensor argument (a writable byte buffer as a tensor over its memory), its bits before the call
    (None: none to compare) and its dtype, shape, device and layout."""

    label: str
    tensor: torch.Tensor
    before: torch.Tensor | None
    meta: tuple[Any, ...]


@dataclass
class _Pending:
    """A comparison enqueued on the device: ``changed`` is a 0-d bool tensor read when the case ends."""

    violation: Violation
    changed: torch.Tensor


@dataclass
class _Record:
    violations: list[Violation] = field(default_factory=list)
    pending: list[_Pending] = field(default_factory=list)


def _meta(t: torch.Tensor) -> tuple[Any, ...]:
    return (t.dtype, tuple(t.shape), t.device, t.layout)


def _tensors(value: object, label: str, depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor reachable from an argument, labelled as a caller would point at it."""
    if depth > 4:
        return
    if isinstance(value, torch.Tensor):
        yield label, value
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _tensors(item, f"{label}[{i}]", depth + 1)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _tensors(item, f"{label}[{key!r}]", depth + 1)
    elif isinstance(value, torch.nn.Module):
        for name, t in value.state_dict(keep_vars=True).items():
            yield f"{label}.{name}", t


def _describe(value: object) -> str:
    return describe_args([value])


def _snapshot(t: torch.Tensor) -> torch.Tensor | None:
    if t.layout != torch.strided or t.device.type == "meta":
        return None
    try:
        return bits(t).clone()
    except Exception:  # a tensor the monitor cannot copy (an odd subclass): its metadata is still compared
        return None


def _extent(t: torch.Tensor) -> tuple[int, int] | None:
    """The byte range ``t``'s elements lie in (None: no memory of its own to share)."""
    if t.layout != torch.strided or t.device.type == "meta" or t.numel() == 0:
        return None
    span = sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride(), strict=True))
    start = t.data_ptr() - sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True) if s < 0)
    return start, start + (span + 1) * t.element_size()


def _offsets(t: torch.Tensor) -> torch.Tensor:
    """The byte offsets of ``t``'s elements from its data pointer (metadata only: the device is not read)."""
    offsets = torch.zeros((), dtype=torch.int64)
    for n, s in zip(t.shape, t.stride(), strict=True):
        offsets = offsets.unsqueeze(-1) + torch.arange(n, dtype=torch.int64) * s
    return offsets.reshape(-1) * t.element_size()


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` share at least one byte of an element (two views of one buffer that
    interleave without sharing an element do not)."""
    if a.device != b.device:
        return False
    ea, eb = _extent(a), _extent(b)
    if ea is None or eb is None or ea[1] <= eb[0] or eb[1] <= ea[0]:
        return False
    if a.numel() > _EXACT_OVERLAP_LIMIT or b.numel() > _EXACT_OVERLAP_LIMIT:
        return True
    bytes_a = (_offsets(a) + a.data_ptr()).unsqueeze(-1) + torch.arange(a.element_size())
    bytes_b = (_offsets(b) + b.data_ptr()).unsqueeze(-1) + torch.arange(b.element_size())
    return bool(torch.isin(bytes_a.reshape(-1), bytes_b.reshape(-1)).any())


def _signature_problem(method: str, result: object) -> str | None:
    """What ``result`` lacks of what ``method`` declares (None: nothing)."""
    if method == "lower":
        if not isinstance(result, bytes) or not result:
            return f"must return the program as non-empty bytes, returned {_type(result)}"
    elif method == "init":
        if result is None:
            return "must return a handle, returned None"
    elif method == "execute":
        if not isinstance(result, list):
            return f"must return a list of tensors, returned {_type(result)}"
        odd = [i for i, t in enumerate(result) if not isinstance(t, torch.Tensor)]
        if odd:
            return f"must return a list of tensors; item {odd[0]} is {_type(result[odd[0]])}"
    elif method == "execute_stats":
        if not isinstance(result, Mapping):
            return f"must return a mapping of counters, returned {_type(result)}"
        for key in ("h2d_bytes", "d2h_bytes"):
            value = result.get(key)
            if type(value) is not int or value < 0:
                return f"{key!r} must be a non-negative int, is {value!r} ({_type(value)})"
    elif method == "get_option":
        if not isinstance(result, str):
            return f"must return the option's value as a str, returned {_type(result)}"
    elif method in ("destroy", "set_option", "mm_out") and result is not None:
        return f"returns None, returned {_type(result)}"
    return None


def _type(value: object) -> str:
    return "None" if value is None else type(value).__name__


class ContractMonitor:
    """The backend under test, every protocol call checked (see the module's doc). Any other attribute is
    the backend's own: the monitor is invisible to the protocol's structural checks."""

    def __init__(self, backend: Any) -> None:
        object.__setattr__(self, "_backend", backend)
        object.__setattr__(self, "_lock", threading.Lock())
        object.__setattr__(self, "_record", _Record())
        object.__setattr__(self, "_earlier", [])
        object.__setattr__(self, "_methods", {})

    # -- the proxy ---------------------------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        try:
            value = getattr(self._backend, name)
        except AttributeError as exc:  # the monitor's own, as if it were the backend (parts.py reads obj)
            raise AttributeError(str(exc), name=name, obj=self) from None
        if name not in PARAMETERS or not callable(value):
            return value
        bound = self._methods.get(name)
        if bound is None or bound[0] is not value:
            method = self._checked(name, value)
            self._methods[name] = (value, method)
            return method
        return bound[1]

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._backend, name, value)

    def __repr__(self) -> str:
        return repr(self._backend)

    # -- what a case reads -------------------------------------------------------------------------------

    def begin(self) -> None:
        """A new case: forget what earlier cases' calls noted."""
        with self._lock:
            object.__setattr__(self, "_record", _Record())

    def violations(self) -> list[Violation]:
        """What the calls since :meth:`begin` broke, in the order they were made (reads the device's
        pending verdicts: call it once the case's work is done)."""
        with self._lock:
            record = self._record
            pending, record.pending = record.pending, []
        found = []
        if pending:
            try:
                if torch.cuda.is_initialized():
                    torch.cuda.synchronize()
                found = [p.violation for p in pending if bool(p.changed.item())]
            except Exception:  # a faulted device: the watchdog names that; the monitor has nothing to add
                found = []
        with self._lock:
            return [*self._record.violations, *found]

    # -- one call ----------------------------------------------------------------------------------------

    def _checked(self, method: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if _capturing() or getattr(_paused, "depth", 0):  # a CUDA graph capture, a metered window
                return fn(*args, **kwargs)
            named = dict(zip(PARAMETERS[method], args, strict=False)) | kwargs
            shown = (f"{k}=<handle>" if k == "handle" else f"{k}={_describe(v)}" for k, v in named.items())
            text = f"{method}({', '.join(shown)})"
            written = WRITTEN.get(method, frozenset())
            reads, writes = self._watch(named, written)
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                self._after_error(text, exc, reads, writes)
                raise
            self._after_return(method, text, result, reads, writes)
            return result

        call.__name__ = method
        call.__doc__ = fn.__doc__
        return call

    def _watch(self, named: Mapping[str, object], written: frozenset[str]) -> tuple[list[_Watched], ...]:
        reads: list[_Watched] = []
        writes: list[_Watched] = []
        for name, value in named.items():
            into = writes if name in written else reads
            if isinstance(value, (bytearray, memoryview)):  # a program's bytes a caller could still change
                if len(value) and not (isinstance(value, memoryview) and value.readonly):
                    buffer = torch.frombuffer(value, dtype=torch.uint8)  # its memory, not a copy
                    into.append(_Watched(name, buffer, _snapshot(buffer), _meta(buffer)))
                continue
            for label, t in _tensors(value, name):
                into.append(_Watched(label, t, _snapshot(t), _meta(t)))
        return reads, writes

    def _changed(self, watched: list[_Watched], violation: Callable[[_Watched, str], Violation]) -> None:
        """Note a violation for each watched tensor that changed (a CUDA comparison is enqueued)."""
        for w in watched:
            t = w.tensor
            if _meta(t) != w.meta:
                self._note(violation(w, f"its metadata changed from {w.meta[:3]} to {_meta(t)[:3]}"))
                continue
            if w.before is None:
                continue
            try:
                now = bits(t)
                if t.device.type == "cuda":
                    changed = (
                        torch.ne(now, w.before).any() if now.numel() else torch.zeros((), dtype=torch.bool)
                    )
                    with self._lock:
                        self._record.pending.append(_Pending(violation(w, "its values changed"), changed))
                elif not torch.equal(now, w.before):
                    self._note(violation(w, "its values changed"))
            except Exception:
                continue

    def _after_error(self, text: str, exc: Exception, reads: list[_Watched], writes: list[_Watched]) -> None:
        if not isinstance(exc, ALLOWED_ERRORS):
            self._note(
                Violation(
                    ERROR_CLASS,
                    text,
                    f"raised {type(exc).__name__}: {str(exc).strip()[:200]!r}; the contract allows "
                    "ValueError (a contract violation), TypeError (a call of the wrong shape) or "
                    "RuntimeError (the library)",
                )
            )
        self._changed(reads, lambda w, how: self._untouched(text, w, how))
        self._changed(
            writes,
            lambda w, how: Violation(
                OUTPUTS_UNTOUCHED,
                text,
                f"the call raised, yet {w.label} was written ({how}); on any error "
                "outputs are left untouched",
            ),
        )

    def _untouched(self, text: str, w: _Watched, how: str) -> Violation:
        return Violation(INPUTS_UNTOUCHED, text, f"{w.label} is only read by the call, yet {how}")

    def _after_return(
        self, method: str, text: str, result: object, reads: list[_Watched], writes: list[_Watched]
    ) -> None:
        problem = _signature_problem(method, result)
        if problem is not None:
            self._note(Violation(RESULT_SIGNATURE, text, problem))
        if method == "execute" and isinstance(result, (list, tuple)):
            self._owned(text, result, reads, writes)  # first: a result aliasing an input is the cause
        self._changed(reads, lambda w, how: self._untouched(text, w, how))

    def _owned(
        self, text: str, result: list[Any] | tuple[Any, ...], reads: list[_Watched], writes: list[_Watched]
    ) -> None:
        returned = [(f"result[{i}]", t) for i, t in enumerate(result) if isinstance(t, torch.Tensor)]
        given = [w.tensor for w in writes]
        for label, t in returned:
            if any(t is g for g in given):
                continue
            for w in reads:
                if overlaps(t, w.tensor):
                    self._note(
                        Violation(
                            RESULTS_OWNED,
                            text,
                            f"{label} shares memory with the argument {w.label}; returned "
                            "tensors belong to the caller and never alias what the caller passed",
                        )
                    )
                    break
            else:
                self._against_earlier(text, label, t, given)
        with self._lock:
            alive = [r for r in self._earlier if r[1]() is not None][-_EARLIER:]
            alive += [(text, weakref.ref(t)) for _, t in returned]
            object.__setattr__(self, "_earlier", alive)

    def _against_earlier(self, text: str, label: str, t: torch.Tensor, given: list[torch.Tensor]) -> None:
        with self._lock:
            earlier = list(self._earlier)
        for call, ref in earlier:
            old = ref()
            if old is None or any(old is g or overlaps(old, g) for g in given):
                continue  # an earlier result the caller gave back as outputs= may be written again
            if overlaps(t, old):
                self._note(
                    Violation(
                        RESULTS_OWNED,
                        text,
                        f"{label} shares memory with a result of an earlier call the "
                        f"caller still holds ({call}); returned tensors belong to the caller",
                    )
                )
                return

    def _note(self, violation: Violation) -> None:
        with self._lock:
            self._record.violations.append(violation)


_paused = threading.local()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Calls made by this thread inside the block go straight to the backend, unchecked: for windows that
    measure the device's own traffic (NVML's PCIe counters), where the monitor's snapshots and comparisons
    would be kernels of their own. The case's other calls stay checked."""
    depth = getattr(_paused, "depth", 0)
    _paused.depth = depth + 1
    try:
        yield
    finally:
        _paused.depth = depth


def _capturing() -> bool:
    return (
        torch.cuda.is_available() and torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()
    )


def unwrapped(backend: Any) -> Any:
    """The backend behind the monitor (``backend`` itself when it is not monitored)."""
    return object.__getattribute__(backend, "_backend") if isinstance(backend, ContractMonitor) else backend
