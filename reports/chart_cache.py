"""A cache of rendered chart SVGs, so a history of many runs does not redraw every old chart per build.

Drawing is most of a dashboard build's time, and every build re-renders every run page of the history.
A chart is a pure function of its inputs, so its SVG is kept under the hash of those inputs: in memory
for the process, and on disk when a directory is given (the dashboard uses ``<history>/chart-cache``).
Files not used by a build are removed at its end, so the directory never grows past one build's charts.

Cached files are read back as untrusted input: the caller re-checks them before inserting them.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path

from harness.results import atomic_write_text

CACHE_VERSION = "2"  # bump when the drawing code changes, so old SVGs are not reused
_memory: dict[str, str] = {}
_directory: Path | None = None
_used: set[str] = set()


@contextlib.contextmanager
def stored_in(directory: Path | None) -> Iterator[None]:
    """Use ``directory`` as the on-disk cache while the block runs; prune unused files at its end."""
    global _directory
    previous, _directory = _directory, directory
    _used.clear()
    try:
        yield
        if directory is not None and directory.is_dir():
            for path in directory.glob("*.svg"):
                if path.stem not in _used:
                    with contextlib.suppress(OSError):
                        path.unlink()
    finally:
        _directory = previous


def cached(key: str, make: Callable[[], str | None], valid: Callable[[str], bool]) -> str | None:
    """The SVG for ``key``: from memory, from disk (if ``valid``), or made now and stored."""
    digest = hashlib.sha256(f"{CACHE_VERSION}\n{key}".encode()).hexdigest()
    _used.add(digest)
    if digest in _memory:
        return _memory[digest]
    path = None if _directory is None else _directory / f"{digest}.svg"
    if path is not None:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            svg = path.read_text(encoding="utf-8")
            if valid(svg):
                _memory[digest] = svg
                return svg
    svg = make()
    if svg is not None:
        _memory[digest] = svg
        if path is not None:
            with contextlib.suppress(OSError):
                atomic_write_text(path, svg)
    return svg
