"""The self-tests' own session: a progress line every 30 s, as the suite prints (``harness/progress.py``), so
the proofs tier (minutes of whole chapter runs) is never silent."""

from __future__ import annotations

import pytest

from harness import progress


def pytest_addoption(parser: pytest.Parser) -> None:
    progress.add_option(parser.getgroup("self-tests"))


def pytest_configure(config: pytest.Config) -> None:
    progress.register(config)
