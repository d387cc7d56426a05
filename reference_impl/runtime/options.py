"""Backend-wide runtime options: ``set_option`` / ``set_options`` / ``get_option``.

One option store serves the whole backend (every handle, every thread). Options may be set before and after
``init``; a handle reads them at the start of every ``execute``, so a change takes effect on the next execute
and never in the middle of one.

Known keys
    ``skip_copy_output_to_cpu_for_method`` (default ``""``): a method name or a comma-separated list of them.
    Tokens are trimmed of surrounding whitespace, empty tokens are ignored, and matching is exact and
    case-sensitive. A handle whose method is named keeps its outputs on the GPU as ordinary CUDA tensors;
    every other handle copies them to the CPU. A handle with no method name never matches.

Rules (each broken rule raises ``OptionError``, a ``ValueError``, naming the key and the rule):

* Keys are ``str`` of at most ``MAX_KEY_CHARS`` (63) characters; values are ``str`` of at most
  ``MAX_VALUE_CHARS`` (255) characters. Upstream copies both into fixed C buffers and silently truncates;
  here an over-long key or value is an error, never shortened. Neither may contain a NUL character (a C
  consumer would silently cut the string there).
* A non-string value is an invalid-argument error and changes nothing.
* **Unknown keys are rejected** with an error listing the known keys, by ``set_option`` and ``get_option``
  alike. An unknown key is almost always a typo (``skip_copy_output_to_cpu_for_methods``) that, silently
  accepted, would leave outputs being copied to the CPU while the caller believes they stay on the GPU.
* ``set_options`` is all-or-nothing: every pair is validated first, then all are applied together under
  one lock (upstream applied the options of a call that came before a bad one and dropped the rest).

Thread safety: the store holds an immutable snapshot that is replaced as a whole under a lock; readers take
the current snapshot without locking, so a reader sees either the state before or after a ``set_options``
call, never a mix.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = [
    "DEFAULTS",
    "KNOWN_KEYS",
    "MAX_KEY_CHARS",
    "MAX_VALUE_CHARS",
    "SKIP_COPY_OUTPUT_TO_CPU_FOR_METHOD",
    "OptionError",
    "OptionStore",
    "get_option",
    "parse_method_list",
    "reset_options",
    "set_option",
    "set_options",
    "should_skip_copy",
    "skip_copy_for",
    "skip_copy_methods",
]

SKIP_COPY_OUTPUT_TO_CPU_FOR_METHOD = "skip_copy_output_to_cpu_for_method"
MAX_KEY_CHARS = 63
"""Longest accepted key (upstream: a 64-byte C buffer including the terminating NUL)."""
MAX_VALUE_CHARS = 255
"""Longest accepted string value (upstream: a 256-byte C buffer including the terminating NUL)."""

DEFAULTS: Mapping[str, str] = MappingProxyType({SKIP_COPY_OUTPUT_TO_CPU_FOR_METHOD: ""})
KNOWN_KEYS: tuple[str, ...] = tuple(DEFAULTS)


class OptionError(ValueError):
    """An option key or value breaks a rule; the message names the key and the rule. Nothing was changed."""


def parse_method_list(value: str) -> frozenset[str]:
    """The method names in a comma-separated list: tokens trimmed, empty tokens ignored, case kept."""
    return frozenset(token.strip() for token in value.split(",") if token.strip())


@dataclass(frozen=True)
class _Snapshot:
    values: Mapping[str, str]
    skip_copy: frozenset[str]


def _snapshot(values: Mapping[str, str]) -> _Snapshot:
    frozen = MappingProxyType(dict(values))
    return _Snapshot(frozen, parse_method_list(frozen[SKIP_COPY_OUTPUT_TO_CPU_FOR_METHOD]))


def _check_key(key: object) -> str:
    if not isinstance(key, str):
        raise OptionError(f"option key must be a str, got {type(key).__name__} ({key!r})")
    if len(key) > MAX_KEY_CHARS:
        raise OptionError(
            f"option key {key[:MAX_KEY_CHARS]!r}... is {len(key)} characters long; "
            f"keys are limited to {MAX_KEY_CHARS} characters (it is rejected, not truncated)"
        )
    if "\0" in key:
        raise OptionError(f"option key {key!r} contains a NUL character; keys may not")
    if key not in DEFAULTS:
        raise OptionError(
            f"unknown option key {key!r}; known keys: {', '.join(repr(k) for k in KNOWN_KEYS)} "
            "(unknown keys are rejected: a misspelt key would otherwise be silently ignored)"
        )
    return key


def _check_value(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise OptionError(
            f"option {key!r} must be a str (a method name or a comma-separated list of method names), "
            f"got {type(value).__name__} ({value!r}); nothing was changed"
        )
    if len(value) > MAX_VALUE_CHARS:
        raise OptionError(
            f"option {key!r}: value is {len(value)} characters long; string values are limited to "
            f"{MAX_VALUE_CHARS} characters (it is rejected, not truncated); nothing was changed"
        )
    if "\0" in value:
        raise OptionError(f"option {key!r}: value contains a NUL character; values may not")
    return value


class OptionStore:
    """A thread-safe option store. The backend uses one module-level instance; tests may make their own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = _snapshot(DEFAULTS)

    def set_options(self, options: Mapping[str, object] | Iterable[tuple[str, object]]) -> None:
        """Validate every pair, then apply them all at once; on any error nothing changes."""
        if isinstance(options, Mapping):
            pairs = list(options.items())
        elif isinstance(options, Iterable) and not isinstance(options, (str, bytes)):
            pairs = list(options)
        else:
            raise OptionError(f"options must be a mapping of key to value, got {type(options).__name__}")
        checked: dict[str, str] = {}
        for pair in pairs:
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise OptionError(f"options must be a mapping or (key, value) pairs, got item {pair!r}")
            key = _check_key(pair[0])
            checked[key] = _check_value(key, pair[1])
        if not checked:
            return
        with self._lock:
            self._state = _snapshot({**self._state.values, **checked})

    def set_option(self, key: str, value: object) -> None:
        self.set_options([(key, value)])

    def get_option(self, key: str) -> str:
        return self._state.values[_check_key(key)]

    def reset(self) -> None:
        """Every option back to its default."""
        with self._lock:
            self._state = _snapshot(DEFAULTS)

    def skip_copy_methods(self) -> frozenset[str]:
        """The parsed ``skip_copy_output_to_cpu_for_method`` list of the current snapshot."""
        return self._state.skip_copy

    def should_skip_copy(self, method_name: str | None) -> bool:
        """Whether a handle of ``method_name`` keeps its outputs on the device (``None`` never matches)."""
        if not isinstance(method_name, str) or not method_name:
            return False
        return method_name in self._state.skip_copy

    @contextlib.contextmanager
    def skip_copy_for(self, methods: Iterable[str]) -> Iterator[None]:
        """Temporarily add ``methods`` to the skip-copy list; restores the previous value on exit.

        Meant for single-owner scripts and tests: a concurrent ``set_option`` of the same key made while the
        block runs is overwritten when the block exits.
        """
        names = [methods] if isinstance(methods, str) else list(methods)
        for name in names:
            if not isinstance(name, str) or "," in name or name != name.strip() or not name:
                raise OptionError(
                    f"option {SKIP_COPY_OUTPUT_TO_CPU_FOR_METHOD!r}: cannot add method {name!r}; a method "
                    "name is a non-empty str without commas or surrounding whitespace"
                )
        key = SKIP_COPY_OUTPUT_TO_CPU_FOR_METHOD
        with self._lock:
            previous = self._state.values[key]
            merged = ",".join(sorted(parse_method_list(previous) | set(names)))
            _check_value(key, merged)
            self._state = _snapshot({**self._state.values, key: merged})
        try:
            yield
        finally:
            with self._lock:
                self._state = _snapshot({**self._state.values, key: previous})


STORE = OptionStore()
"""The backend-wide store every handle reads."""

set_option = STORE.set_option
set_options = STORE.set_options
get_option = STORE.get_option
reset_options = STORE.reset
skip_copy_methods = STORE.skip_copy_methods
should_skip_copy = STORE.should_skip_copy
skip_copy_for = STORE.skip_copy_for
