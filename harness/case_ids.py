"""Case ids from before the chapters were folders, read as today's: the one place that maps them.

Until the chapters moved into folders of their own, a chapter was the file ``conformance/test_<chapter>.py``,
so its case ids read ``conformance/test_mm_out.py::test_x[...]``; now it is
``conformance/mm_out/test_mm_out.py::test_x[...]``. Ids of the old form live on where users stored them:
known-failure entries (``case = ...``), the recorded case seconds (``case_seconds.json``) and the result files
of earlier runs that ``nox -s compare`` and ``--baseline`` compare with. Each of those reads them through
:func:`current_case_id`, here, so an old id keeps naming its case. Standard library only: the known-failures
matcher (``conformance/suite/known_failures.py``), the case order (``harness/case_order.py``) and the
comparison (``reports/compare.py``) all use it.
"""

from __future__ import annotations

import re

#: A case id (or a known-failure glob over one, ``conformance/test_*.py::...`` too) of a chapter file directly
#: under ``conformance/``.
_FLAT_CHAPTER = re.compile(r"^conformance/test_([a-z0-9_*?]+)\.py(?=::|$)")


def current_case_id(case_id: str) -> str:
    """``conformance/test_<chapter>.py::...`` (the flat layout) -> today's
    ``conformance/<chapter>/test_<chapter>.py::...``, a glob's wildcards in both places
    (``conformance/test_*.py`` -> ``conformance/*/test_*.py``); any other id as it is."""
    return _FLAT_CHAPTER.sub(r"conformance/\1/test_\1.py", case_id, count=1)
