"""How the generated cases run: Hypothesis settings that make a CI run deterministic and bounded.

The differential chapter and the generated-input cases draw their inputs with Hypothesis (the library
``data-apis/array-api-tests`` is built on). A CI run must give the same verdict every time, so by default:

* the examples are derived from each test's own code (``derandomize``), not from a clock or a database:
  the same commit draws the same examples on every machine;
* no example database is read or written (nothing outside the run decides what runs);
* each test has a fixed example count and step count (:func:`budget`), so its cost is bounded;
* no per-example deadline (an AOTInductor call on a cold cache takes seconds; the budget bounds the time).

``--hypothesis-seed N`` (Hypothesis's own pytest option) varies the examples: this module then turns
``derandomize`` off so that the seed takes effect. ``--generated-examples K`` scales every budget (e.g. ``4``
for a nightly soak). A failing example is shrunk and printed as the steps that reproduce it; the case's
repro line (with the same seed option) finds it again. ``--generated-no-shrink`` reports the first failing
example as found, unshrunk: for the self-tests, which only need to know *that* a broken backend fails.
"""

from __future__ import annotations

import re
from typing import TypeVar

import hypothesis
import pytest
from hypothesis import HealthCheck, Phase, reproduce_failure, settings

T = TypeVar("T")

PROFILE = "conformance"
SEEDED_PROFILE = "conformance-seeded"
NO_SHRINK_PROFILE = f"{PROFILE}-no-shrink"
_SCALE_KEY = pytest.StashKey[float]()
_scale = 1.0

_COMMON = {
    "database": None,
    "deadline": None,
    "print_blob": True,
    # One failure per case, the first found shrunk: a group of several has no one rule to report or declare.
    "report_multiple_bugs": False,
    # Explicit examples, generation and shrinking; no "explain" phase (it reruns every example again).
    "phases": (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
    "suppress_health_check": (
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
        HealthCheck.filter_too_much,
    ),
}
settings.register_profile(PROFILE, derandomize=True, **_COMMON)
settings.register_profile(SEEDED_PROFILE, derandomize=False, **_COMMON)
_NO_SHRINK = {**_COMMON, "phases": (Phase.explicit, Phase.reuse, Phase.generate, Phase.target)}
settings.register_profile(NO_SHRINK_PROFILE, derandomize=True, **_NO_SHRINK)
settings.register_profile(f"{SEEDED_PROFILE}-no-shrink", derandomize=False, **_NO_SHRINK)


def add_options(group: pytest.OptionGroup) -> None:
    group.addoption(
        "--generated-examples",
        metavar="SCALE",
        type=float,
        default=1.0,
        help="scale the example and step budget of every generated case (default 1: the CI budget)",
    )
    group.addoption(
        "--generated-replay",
        metavar="BLOB",
        default=None,
        help="replay one failing example of a generated case: the BLOB its failure message names (use with "
        "that case's repro command, under the same Hypothesis version)",
    )
    group.addoption(
        "--generated-no-shrink",
        action="store_true",
        default=False,
        help="report a generated case's first failing example unshrunk (faster; the self-tests use it)",
    )


#: ``--generated-replay``: the shrunk example to replay (Hypothesis's blob), or None.
_replay: bytes | None = None
#: How Hypothesis says to replay an example: by editing the test. The suite says its own option instead.
_REPRODUCE = re.compile(
    r"You can reproduce this test case by temporarily adding @reproduce_failure\('([^']+)', b'([^']+)'\) "
    r"as a decorator on your test function"
)


def replay_note(text: str) -> str:
    """``text`` with Hypothesis's advice to edit the test replaced by the suite's own option."""
    return _REPRODUCE.sub(
        lambda m: (
            f"replay this example: add --generated-replay={m.group(2)} to the case's repro command "
            f"(Hypothesis {m.group(1)})"
        ),
        text,
    )


def replayed(target: T) -> T:
    """``target`` (a ``@given`` test or a state machine class) made to replay ``--generated-replay``'s
    example first, when the option is given; else ``target`` itself."""
    if _replay is None:
        return target
    return reproduce_failure(hypothesis.__version__, _replay)(target)


def configure(config: pytest.Config) -> None:
    """Load the profile before any chapter is imported (``@settings`` reads it at decoration time)."""
    global _scale
    seeded = config.getoption("--hypothesis-seed", None) is not None
    profile = SEEDED_PROFILE if seeded else PROFILE
    settings.load_profile(
        f"{profile}-no-shrink" if config.getoption("--generated-no-shrink", False) else profile
    )
    _scale = max(0.01, float(config.getoption("--generated-examples", 1.0) or 1.0))
    global _replay
    blob = config.getoption("--generated-replay", None)
    _replay = blob.strip().removeprefix("b'").removesuffix("'").encode() if blob else None


def budget(examples: int, steps: int | None = None) -> settings:
    """``@settings`` for one generated case: ``examples`` examples (and ``steps`` steps per stateful run),
    scaled by ``--generated-examples``."""
    extra = {} if steps is None else {"stateful_step_count": max(1, round(steps * _scale))}
    return settings(max_examples=max(1, round(examples * _scale)), **extra)
