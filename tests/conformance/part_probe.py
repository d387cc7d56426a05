"""pytest plugin (``-p tests.conformance.part_probe``): runs each case of the suite against every combination
of optional protocol parts that can make a difference to it, in one process, and writes what each run did.

With ``--backend tests.minimal_backends:<spec>`` (a :class:`~tests.minimal_backends.MinimalBackend`), each
case runs first with the spec's combination. Its backend records which dimensions (optional parts and
attributes) the case looked up; those are the only things the case can know about the backend's parts,
so the run's outcome holds for every combination that agrees on them. Then the case runs again for every
other setting of those dimensions, and so on for any dimension a new run looks up, until every
combination agrees with some run on every dimension that run looked up. The suite's per-process program
cache is kept per setting of what ``lower`` depends on, and a program it serves counts as the ``lower`` call
it stands for (:class:`ProgramCache`): no run is decided by a program a run of another setting left behind.

``--probe-out FILE`` gets one JSON line per case: ``{"case", "runs": [{"assignment", "looked_up",
"outcome", "message"}]}``, and a first line ``{"case": "<session>", ...}`` with what the session's own
start (configure, preflight, collection) looked up. ``--probe-representatives`` keeps, of each test's
parametrisations, those with the cheapest value of every data parameter (:data:`DATA_PARAMS`: the model, the
dtype, a shape ...), and all values of the others: which parts a case uses does not depend on its data.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest
from _pytest.runner import runtestprotocol

from harness.pytest_plugin import _outcome
from tests.minimal_backends import DIMENSIONS, MinimalBackend

SESSION = "<session>"
#: Parameters that only choose data: a case's use of protocol parts does not depend on them.
DATA_PARAMS = frozenset(
    {
        "dtype",
        "model",
        "method",
        "variant",
        "shape",
        "size",
        "layout",
        "layout_self",
        "layout_mat2",
        "n",
        "case",
    }
)  # case: a view-pass graph; method: which method's graph or program; variant: which model change
#: Cheapest first; anything else after these.
_DTYPE_COST = {"float32": 0}
_MODEL_COST = {
    m: i
    for i, m in enumerate(("add_mul", "add", "linear", "slicing_block", "llm", "asr", "hf_llm", "hf_whisper"))
}
_METHOD_COST = {"decode": 0}  # the one-token step: the smallest graph and program of a model


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("part probe")
    group.addoption("--probe-out", metavar="FILE", help="write each case's runs here (JSON lines)")
    group.addoption(
        "--probe-representatives",
        action="store_true",
        help="run one parametrisation per test and non-data parameters (the cheapest)",
    )


def _params(item: pytest.Item) -> dict[str, Any]:
    return dict(getattr(getattr(item, "callspec", None), "params", {}))


def _value_cost(name: str, value: object) -> int:
    if name == "dtype":
        return _DTYPE_COST.get(str(value), 1)
    if name == "model":
        return _MODEL_COST.get(str(value), len(_MODEL_COST))
    if name == "method":
        return _METHOD_COST.get(str(value), 1)
    return 0  # first in collection order


def representatives(items: list[pytest.Item]) -> list[pytest.Item]:
    """Of each test's parametrisations, those whose data parameters (:data:`DATA_PARAMS`) all take the
    cheapest value the test has for them; every value of every other parameter stays."""
    by_test: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_test.setdefault(item.nodeid.split("[")[0], []).append(item)
    keep: set[int] = set()
    for group in by_test.values():
        chosen: dict[str, str] = {}
        for name in sorted({n for item in group for n in _params(item)} & DATA_PARAMS):
            values = [_params(item)[name] for item in group if name in _params(item)]
            chosen[name] = repr(min(values, key=lambda v, name=name: _value_cost(name, v)))
        for item in group:
            params = _params(item)
            if all(repr(params[n]) == v for n, v in chosen.items() if n in params):
                keep.add(id(item))
    return [item for item in items if id(item) in keep]


class ProgramCache(dict):  # type: ignore[type-arg]
    """The suite's per-process program cache (``programs._LOWERED``) as the probe keeps it: one store per
    setting of what ``lower`` depends on (``lowering``, the placement keys), and a program served from it
    counts as the lookups the ``lower`` call it stands for would have made. So a case's runs behave, and
    are recorded, as if every program came from the backend, at the cost of lowering each program once."""

    def __init__(self, probe: Any) -> None:
        super().__init__()
        self.probe = probe
        self.stores: dict[tuple[str, str], dict[Any, Any]] = {}

    def _store(self) -> dict[Any, Any]:
        setting = (self.probe.setting("lowering"), self.probe.setting("device_placement"))
        return self.stores.setdefault(setting, {})

    def _served(self, key: Any) -> None:
        self.probe.looked_up.add("lowering")
        if key[-1] != "[]":  # lowered with options: what lower accepts depends on the placement keys
            self.probe.looked_up.add("device_placement")

    def __contains__(self, key: object) -> bool:
        hit = key in self._store()
        if hit:
            self._served(key)
        return hit

    def __getitem__(self, key: Any) -> Any:
        self._served(key)
        return self._store()[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._store()[key] = value


class PartProbe:
    def __init__(self, config: pytest.Config, out: Path) -> None:
        self.config = config
        self.out = out
        self.session_written = False
        self.programs: ProgramCache | None = None
        out.write_text("")

    def _backend(self) -> MinimalBackend:
        from conformance.common.contract_monitor import unwrapped
        from conformance.common.session import BACKEND_KEY

        backend = unwrapped(self.config.stash[BACKEND_KEY])
        if not isinstance(backend, MinimalBackend):
            raise pytest.UsageError(
                "-p tests.conformance.part_probe needs --backend tests.minimal_backends:<spec>"
            )
        return backend

    def _write(self, record: dict[str, Any]) -> None:
        with open(self.out, "a", encoding="utf-8") as out:
            out.write(json.dumps(record, sort_keys=True) + "\n")

    def _write_session(self) -> None:
        if not self.session_written:
            probe = self._backend().probe
            self._write(
                {"case": SESSION, "assignment": probe.assignment, "looked_up": sorted(probe.looked_up)}
            )
            self.session_written = True

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if config.getoption("--probe-representatives"):
            kept = representatives(items)
            config.hook.pytest_deselected(items=[i for i in items if i not in kept])
            items[:] = kept

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool:
        from conformance.common import programs

        self._write_session()
        probe = self._backend().probe
        if self.programs is None:
            self.programs = ProgramCache(probe)
        root = dict(probe.assignment)
        frontier, runs = [root], []
        programs._LOWERED = self.programs  # type: ignore[assignment]
        while frontier:
            assignment = frontier.pop(0)
            probe.reset(assignment)
            # nextitem=None: everything is torn down after each run, so the next one sets up afresh.
            began = time.perf_counter()
            reports = runtestprotocol(item, log=False, nextitem=None)
            seconds = round(time.perf_counter() - began, 3)
            outcome, message = _outcome({r.when: r for r in reports})
            looked_up = sorted(probe.looked_up)
            run = {"assignment": assignment, "looked_up": looked_up, "outcome": outcome, "message": message}
            runs.append({**run, "seconds": seconds})
            new = [d for d in looked_up if d not in assignment]
            for values in itertools.product(*(DIMENSIONS[d] for d in new)):
                if any(v != DIMENSIONS[d][0] for d, v in zip(new, values, strict=True)):
                    frontier.append({**assignment, **dict(zip(new, values, strict=True))})
        probe.reset(root)
        self._write({"case": item.nodeid, "runs": runs})
        return True

    def pytest_sessionfinish(self) -> None:
        self._write_session()


def pytest_configure(config: pytest.Config) -> None:
    out = config.getoption("--probe-out")
    if out:
        config.pluginmanager.register(PartProbe(config, Path(out)), "part-probe")
