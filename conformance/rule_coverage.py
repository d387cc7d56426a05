"""Rule coverage: every rule id of the rule table -> the cases that check it and the broken backends that
prove a chapter fails on it.

:func:`coverage_rows` returns one row per rule id for the dashboard's coverage page. The rules, their levels,
clauses and exemptions are the rule table's (``conformance/catalogue/rule_table.py``); the sentences of the
SPEC and the protocol each rule enforces are the sentence catalogue's (``python -m conformance.catalogue``).
What this module finds:

* **cases** — static analysis of the chapters (``conformance/test_*.py``), not markers. The rule id of a
  check is an argument of ``fail``/``assert_*``: a module constant the chapter looked up in the table
  (``VALUES = rule_id("mm_out/values")``), or one picked by the case's parameters (``BAD_INPUT_RULES[rule]``,
  ``rules.output_device`` of the mechanism a helper is given), and two chapters belong to other owners, so
  a marker on each test would be a second, hand-kept copy of what the code already says and would drift.
  Instead every case pytest would collect is expanded from its ``parametrize`` marks, and the test
  function is walked (its body, the helpers it calls inside ``conformance/``, the fixtures it asks for,
  and the module constants it reads) with the case's parameter values bound, so ``BAD_INPUT_RULES[rule]``
  becomes ``mm_out/dtype-mismatch-mat2`` for that case. A case "checks" every rule id its code can fail
  with. ``tests/conformance/test_rule_coverage.py`` holds the expansion against pytest's own collection, so it
  cannot drift.
* **broken backends** — given, not found: the broken backends and their declarations (which rules each
  must make its chapter fail) live with the self-tests that prove them, in ``tests/``, and product code
  never imports tests. ``python -m tests.rule_coverage`` passes them in (:class:`Proof`); this module's
  own command prints the table without them. Where every broken backend of a rule needs CUDA the status is
  ``proven-gpu``: the CPU self-tests skip those, and only a GPU run of them (``.ci/gpu/followup.sh``) is the
  proof.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import importlib
import inspect
import io
import itertools
import json
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from conformance.catalogue import CATALOGUE, CHAPTERS, RULES_BY_ID, for_rule, is_rule_id
from conformance.declared_rules import declared
from conformance.rules import level_of
from harness.backend_loader import DEFAULT_BACKEND

__all__ = ["CHAPTERS", "ROOT", "Case", "Proof", "Row", "all_cases", "coverage_rows", "is_rule_id", "main"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@dataclass(frozen=True)
class Proof:
    """A broken backend (``module:attr``, as ``--backend`` takes it) that its chapter fails on ``rules``; the
    self-tests in ``tests/`` run it to prove that. ``cuda``: the failing cases need a CUDA device."""

    spec: str
    rules: tuple[str, ...]
    cuda: bool = False


# ===================================================================================== cases (static)

#: Rule-id text with unresolved ``{...}`` parts keeps them; such a template is reported, never dropped.
_PLACEHOLDER = re.compile(r"\{[^{}]*\}")
UNKNOWN = object()
#: A subscript or attribute whose parts are known but that is not there: a branch this case never reaches.
_ABSENT = object()
#: Modules whose functions look rules up rather than check them: a walk into ``level_of`` read the whole
#: table as if every case could fail with every rule.
_LOOKUPS = ("conformance.rules", "conformance.catalogue")


@dataclass(frozen=True)
class Case:
    """One case pytest collects: its node id, and the rule ids its code can fail with."""

    id: str
    chapter: str
    rules: frozenset[str]


@functools.cache
def _module(name: str) -> ModuleType:
    return importlib.import_module(name)


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def _function_def(func: Callable[..., Any]) -> ast.FunctionDef | None:
    """The AST of a function defined at module level in ``conformance/``, or of a method of a class defined
    there (a state machine's rules), None for anything else."""
    # A Hypothesis test (``@given``) keeps the function it wraps there, not in ``__wrapped__``.
    func = getattr(getattr(func, "hypothesis", None), "inner_test", None) or func
    func = inspect.unwrap(func)
    module_name = getattr(func, "__module__", "") or ""
    if not module_name.startswith("conformance.") or not inspect.isfunction(func):
        return None
    if module_name.startswith(_LOOKUPS):
        return None
    path = Path(inspect.getfile(func))
    owner, _, name = func.__qualname__.rpartition(".")
    body: list[ast.stmt] = _tree(path).body
    if owner:
        classes = [n for n in body if isinstance(n, ast.ClassDef) and n.name == owner]
        body = classes[0].body if classes else []
    for node in body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def _methods(value: Any) -> list[Callable[..., Any]]:
    """The methods of a Hypothesis state machine defined in ``conformance/`` (its rules are what the case
    runs), else none."""
    if not isinstance(value, type) or not (value.__module__ or "").startswith("conformance."):
        return []
    if not any(base.__name__ == "RuleBasedStateMachine" for base in value.__mro__):
        return []
    methods = [inspect.unwrap(v) for v in vars(value).values() if inspect.isfunction(inspect.unwrap(v))]
    return [m for m in methods if not m.__code__.co_filename.startswith("<")]  # not dataclass-generated


def _resolve(expr: ast.expr, env: Mapping[str, Any], module: ModuleType) -> Any:
    """The value of a simple expression (constant, name, attribute, subscript, f-string), else UNKNOWN."""
    if isinstance(expr, ast.Constant):
        return expr.value
    if isinstance(expr, ast.Name):
        if expr.id in env:
            return env[expr.id]
        return getattr(module, expr.id, UNKNOWN)
    if isinstance(expr, ast.Attribute):
        base = _resolve(expr.value, env, module)
        return UNKNOWN if base is UNKNOWN else getattr(base, expr.attr, UNKNOWN)
    if isinstance(expr, ast.Subscript):
        base, key = _resolve(expr.value, env, module), _resolve(expr.slice, env, module)
        try:
            return UNKNOWN if UNKNOWN in (base, key) else base[key]
        except (KeyError, IndexError, TypeError):
            return UNKNOWN
    if isinstance(expr, ast.JoinedStr):
        return _render(expr, env, module)
    return UNKNOWN


def _render(expr: ast.JoinedStr, env: Mapping[str, Any], module: ModuleType) -> str:
    """An f-string with what is known filled in; unknown parts stay ``{source}``."""
    parts: list[str] = []
    for value in expr.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value))
        elif isinstance(value, ast.FormattedValue):
            got = _resolve(value.value, env, module)
            parts.append(f"{{{ast.unparse(value.value)}}}" if got is UNKNOWN else str(got))
    return "".join(parts)


def _bind(func: Callable[..., Any], call: ast.Call, env: Mapping[str, Any], module: ModuleType) -> dict:
    """The callee's parameters bound to what the caller passes (UNKNOWN where not a simple value)."""
    try:
        params = list(inspect.signature(inspect.unwrap(func)).parameters)
    except (TypeError, ValueError):
        return {}
    bound: dict[str, Any] = {}
    for name, arg in zip(params, call.args, strict=False):
        if not isinstance(arg, ast.Starred):
            bound[name] = _resolve(arg, env, module)
    for keyword in call.keywords:
        if keyword.arg is not None:
            bound[keyword.arg] = _resolve(keyword.value, env, module)
    return {k: v for k, v in bound.items() if v is not UNKNOWN}


def _strings_in(value: Any, depth: int = 0) -> Iterator[str]:
    """Strings inside a module constant (dicts, lists, tuples; keys and values), a few levels deep."""
    if isinstance(value, str):
        yield value
    elif depth < 3 and isinstance(value, Mapping):
        for k, v in value.items():
            yield from _strings_in(k, depth + 1)
            yield from _strings_in(v, depth + 1)
    elif depth < 3 and isinstance(value, (list, tuple, set, frozenset)):
        for v in value:
            yield from _strings_in(v, depth + 1)


def _local_env(func: ast.FunctionDef, env: dict[str, Any], module: ModuleType) -> dict[str, Any]:
    """``env`` plus the function's simple local assignments of strings (``rule = f"x/{y}"``), in order."""
    local = dict(env)
    for node in _nodes(func):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target, value = node.targets[0], node.value
        pairs: list[tuple[ast.expr, ast.expr]] = [(target, value)]
        if (
            isinstance(target, ast.Tuple)
            and isinstance(value, ast.Tuple)
            and len(target.elts) == len(value.elts)
        ):
            pairs = list(zip(target.elts, value.elts, strict=True))
        for name, expr in pairs:
            if isinstance(name, ast.Name) and name.id not in env:
                got = _resolve(expr, local, module)
                if isinstance(got, str):
                    local[name.id] = got
    return local


@functools.cache
def _filled_at_run_time(module_name: str) -> frozenset[str]:
    """Module-level names whose source value is an empty ``{}``/``[]``/``set()``: caches the chapters fill
    while cases run (``_RUNS``). Their live contents depend on which tests ran first in this process, so
    they are never read as constants (a worker that ran the view-pass self-tests first saw ~49 case ids
    as rule ids)."""
    path = inspect.getsourcefile(_module(module_name))
    if path is None:
        return frozenset()
    names: set[str] = set()
    for node in _tree(Path(path)).body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        value = getattr(node, "value", None)
        empty = (
            isinstance(value, (ast.Dict, ast.List, ast.Set))
            and not getattr(value, "keys", getattr(value, "elts", None))
        ) or (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id in ("dict", "list", "set")
            and not value.args
        )
        if empty:
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return frozenset(names)


def rules_of(
    func: Callable[..., Any], env: Mapping[str, Any], *, fixtures: Mapping[str, Callable] | None = None
) -> frozenset[str]:
    """Rule ids (or templates with ``{...}`` left) that ``func`` called with ``env`` can fail with."""
    found: set[str] = set()
    _walk(func, dict(env), found, set(), fixtures or {})
    return frozenset(found)


#: What a walk from (function, arguments, fixtures) found, when it met no call already being walked above
#: it (a cycle's partial answer is not kept): a thousand cases share the helpers they call.
_WALKED: dict[tuple, frozenset[str]] = {}


@functools.cache
def _nodes(node: ast.FunctionDef) -> tuple[ast.AST, ...]:
    """The function's nodes, its decorators left out: they run once, on import, not in a case (a
    ``parametrize`` over ``AFTER_DESTROY`` gave each case every rule id of the table it reads)."""
    decorators = {id(n) for d in node.decorator_list for n in ast.walk(d)}
    return tuple(n for n in ast.walk(node) if id(n) not in decorators)


def _walk(func: Callable, env: dict[str, Any], found: set[str], seen: set[tuple], fixtures: Mapping) -> bool:
    """Add what ``func`` called with ``env`` can fail with to ``found``; False if a cycle cut the walk."""
    node = _function_def(func)
    if node is None:
        return True
    key = (func, tuple(sorted((k, repr(v)) for k, v in env.items())), frozenset(fixtures.items()))
    if key in _WALKED:
        found.update(_WALKED[key])
        return True
    if key in seen:
        return False
    seen.add(key)
    mine: set[str] = set()
    complete = _walk_body(func, node, env, mine, seen, fixtures)
    found.update(mine)
    if complete:
        _WALKED[key] = frozenset(mine)
    return complete


def _rule_ids_at(sub: ast.AST, env: Mapping[str, Any], module: ModuleType, read: set[int]) -> set[str]:
    """The rule ids one node of a function names. A literal (or an f-string the case's values fill) with a
    rule id's shape counts, so an id written past the table shows as a row the table lacks; a value read
    from a module constant or picked by the case (``BAD_INPUT_RULES[rule]``, ``rules.values``) counts when
    it is a rule id of the table; a constant the case reads whole (``COUNTER_RULES``) gives all of its."""
    if isinstance(sub, ast.Constant) and isinstance(sub.value, str) and is_rule_id(sub.value):
        return {sub.value}
    if isinstance(sub, ast.JoinedStr):
        text = _render(sub, env, module)
        ok = is_rule_id(_PLACEHOLDER.sub("x", text)) and "/" in _PLACEHOLDER.sub("", text)
        return {text} if ok else set()
    if isinstance(sub, (ast.Subscript, ast.Attribute)) and isinstance(sub.ctx, ast.Load):
        value = _lookup(sub, env, module)
        if value is _ABSENT or isinstance(value, str):  # its base is read: not all of a constant's ids
            read.update(id(n) for n in ast.walk(sub.value))
        return {value} if isinstance(value, str) and value in RULES_BY_ID else set()
    if (
        isinstance(sub, ast.Name)
        and isinstance(sub.ctx, ast.Load)
        and sub.id not in env
        and sub.id not in _filled_at_run_time(module.__name__)
    ):
        value = getattr(module, sub.id, None)
        if isinstance(value, str):
            return {value} if value in RULES_BY_ID else set()
        if isinstance(value, (Mapping, list, tuple)):
            return {s for s in _strings_in(value) if s in RULES_BY_ID}
    return set()


def _lookup(expr: ast.Subscript | ast.Attribute, env: Mapping[str, Any], module: ModuleType) -> Any:
    """A subscript's or attribute's value; :data:`UNKNOWN` when a part is not known (a value only a run
    gives), :data:`_ABSENT` when the parts are known and the key or attribute is not there."""
    base = _resolve(expr.value, env, module)
    if base is UNKNOWN:
        return UNKNOWN
    if isinstance(expr, ast.Attribute):
        return getattr(base, expr.attr, _ABSENT)
    key = _resolve(expr.slice, env, module)
    if key is UNKNOWN:
        return UNKNOWN
    try:
        return base[key]
    except (KeyError, IndexError, TypeError):
        return _ABSENT


def _walk_body(
    func: Callable,
    node: ast.FunctionDef,
    env: dict[str, Any],
    found: set[str],
    seen: set[tuple],
    fixtures: Mapping,
) -> bool:
    complete = True
    module = _module(inspect.unwrap(func).__module__)
    env = _local_env(node, env, module)
    for param in node.args.args:  # fixtures the function asks for, defined in the chapter
        fixture = fixtures.get(param.arg)
        if fixture is not None:
            complete &= _walk(fixture, {}, found, seen, fixtures)
    read: set[int] = set()  # names already read as the base of a subscript or attribute that resolved
    for sub in _nodes(node):
        if id(sub) in read:
            continue
        found.update(_rule_ids_at(sub, env, module, read))
        if (
            isinstance(sub, ast.Name)
            and isinstance(sub.ctx, ast.Load)
            and sub.id not in env
            and sub.id not in _filled_at_run_time(module.__name__)
        ):
            for method in _methods(getattr(module, sub.id, None)):  # a class the case builds on: its methods
                complete &= _walk(method, {}, found, seen, fixtures)
        if isinstance(sub, ast.Call):
            callee = _resolve(sub.func, env, module)
            if callable(callee) and _function_def(callee) is not None:
                complete &= _walk(callee, _bind(callee, sub, env, module), found, seen, fixtures)
    return complete


# --- expanding parametrize like pytest does (checked against pytest's own collection by a self-test)


def _param_id(value: Any, argname: str, index: int) -> str:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return str(value)
    return f"{argname}{index}"


def _expand(marks: Sequence[Any]) -> list[tuple[str, dict[str, Any]]]:
    """(id, params) of every case the ``parametrize`` marks make, in pytest's order and with its ids."""
    axes: list[list[tuple[str, dict[str, Any]]]] = []
    for mark in marks:  # pytestmark lists the bottom decorator first, as pytest applies them
        if mark.name != "parametrize":
            continue
        argnames, values = mark.args[0], mark.args[1]
        names = [n.strip() for n in argnames.split(",")] if isinstance(argnames, str) else list(argnames)
        ids = mark.kwargs.get("ids")
        axis: list[tuple[str, dict[str, Any]]] = []
        for index, raw in enumerate(values):
            given_id = getattr(raw, "id", None)
            vals = raw.values if hasattr(raw, "marks") and hasattr(raw, "values") else raw
            vals = tuple(vals) if len(names) > 1 else (vals[0] if hasattr(raw, "marks") else vals,)
            params = dict(zip(names, vals, strict=True))
            if given_id is None and ids is not None:
                given_id = ids[index]
            if given_id is None:
                given_id = "-".join(_param_id(params[n], n, index) for n in names)
            axis.append((str(given_id), params))
        axes.append(axis)
    cases = []
    for combo in itertools.product(*axes):
        ids = [i for i, _ in combo]
        params = {k: v for _, p in combo for k, v in p.items()}
        cases.append(("-".join(ids), params))
    return cases


def _fixtures(module: ModuleType) -> dict[str, Callable]:
    """Fixtures defined in a chapter, by name (pytest wraps them; the wrapped function is analysed)."""
    found = {}
    for name, value in vars(module).items():
        if hasattr(value, "_fixture_function_marker"):  # pytest >= 8.4: a FixtureFunctionDefinition
            found[name] = value._get_wrapped_function()
    return found


#: The suite's fixtures that give a case the backend under test (``conformance/conftest.py``).
_BACKEND_FIXTURES = frozenset({"backend", "runtime"})


def _backend_fixtures(fixtures: Mapping[str, Callable]) -> frozenset[str]:
    """The fixtures that give a case the backend, the chapter's own that ask for one included."""
    found = set(_BACKEND_FIXTURES)
    while True:
        more = {
            name
            for name, fixture in fixtures.items()
            if name not in found and found & set(inspect.signature(fixture).parameters)
        }
        if not more:
            return frozenset(found)
        found |= more


def chapter_cases(stem: str) -> list[Case]:
    """Every case of chapter module ``conformance/<stem>.py`` with the rule ids it checks. A case that asks
    for the backend checks the contract monitor's rules too: its every call goes through the monitor
    (``conformance/contract_monitor.py``)."""
    from conformance.contract_monitor import RULES as MONITOR_RULES

    module = _module(f"conformance.{stem}")
    fixtures = _fixtures(module)
    backend_fixtures = _backend_fixtures(fixtures)
    cases: list[Case] = []
    path = f"conformance/{stem}.py"
    for name, func in vars(module).items():
        if not name.startswith("test_") or not inspect.isfunction(func):
            continue
        for case_id, params in _expand(getattr(func, "pytestmark", [])) or [("", {})]:
            node = f"{path}::{name}" + (f"[{case_id}]" if case_id else "")
            rules = rules_of(func, params, fixtures=fixtures)
            if backend_fixtures & set(inspect.signature(func).parameters):
                rules |= set(MONITOR_RULES)
            # A parameter that knows which of the spelled-out rules its case cannot fail (a view-pass case
            # with no policy copy cannot fail ``<rule>/policy``) takes them out: static analysis cannot
            # tell a branch no case reaches.
            for value in params.values():
                unreachable = getattr(value, "unreachable_rules", None)
                if callable(unreachable):
                    rules -= unreachable()
            cases.append(Case(node, CHAPTERS.get(stem, stem), rules))
    return cases


def all_cases() -> list[Case]:
    return [case for stem in CHAPTERS for case in chapter_cases(stem)]


class _Declarations:
    """A pytest plugin keeping every collected case with the rules it declares."""

    def __init__(self) -> None:
        self.cases: list[Case] = []

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:
            stem = item.path.stem
            self.cases.append(Case(item.nodeid, CHAPTERS.get(stem, stem), declared(item)))


def collected_cases(stems: Sequence[str] = tuple(CHAPTERS)) -> list[Case]:
    """Every case pytest collects from the chapters ``conformance/<stem>.py``, with the rule ids it declares
    (``conformance/declared_rules.py``): pytest's own collection, in this process, against the reference
    backend (whichever backend a run tests, the cases are the same). Its output is shown only on failure."""
    plugin = _Declarations()
    args = [
        "--collect-only", "-q", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"),
        "--rootdir", str(ROOT), "--backend", DEFAULT_BACKEND,
        *(str(HERE / f"{stem}.py") for stem in stems),
    ]  # fmt: skip
    output = io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        code = pytest.main(args, plugins=[plugin])
    if code != pytest.ExitCode.OK:
        tail = output.getvalue()[-4000:]
        raise RuntimeError(f"collecting the chapters failed (pytest exit {code}):\n{tail}")
    return plugin.cases


# ================================================================================================ rows


@dataclass(frozen=True)
class Row:
    """One rule id: its level, the chapter(s) and cases that check it, what proves a chapter fails on it."""

    rule: str
    level: str
    chapters: list[str]
    cases: list[str]
    broken_backends: list[str]
    spec: list[str] = field(default_factory=list)
    """The sentences of the protocol and the SPEC this rule enforces, as the catalogue quotes them."""
    exemption: str | None = None
    exemption_reason: str | None = None
    gpu_only: bool = False
    """Every broken backend that proves it needs CUDA: CPU self-tests skip them, a GPU run proves them."""

    @property
    def status(self) -> str:
        if not self.cases:
            return "not-checkable" if self.exemption == "not-checkable" else "NO CASE"
        if self.broken_backends:
            return "proven-gpu" if self.gpu_only else "proven"
        if self.exemption is not None:
            return self.exemption
        return "NO BROKEN BACKEND"


def coverage_rows(cases: Sequence[Case] | None = None, proofs: Sequence[Proof] = ()) -> list[Row]:
    """One row per rule id of the rule table, and per rule id a case checks that the table lacks (the
    self-test fails on those), sorted by rule id."""
    cases = all_cases() if cases is None else cases
    by_rule: dict[str, list[Case]] = {}
    for case in cases:
        for rule in case.rules:
            by_rule.setdefault(rule, []).append(case)
    rows = []
    for rule in sorted(set(RULES_BY_ID) | set(by_rule)):
        proving = [p for p in proofs if rule in p.rules]
        exempt = RULES_BY_ID[rule].exempt if rule in RULES_BY_ID else ""
        rows.append(
            Row(
                rule=rule,
                level=level_of(rule).value,
                chapters=sorted({c.chapter for c in by_rule.get(rule, [])}),
                cases=sorted(c.id for c in by_rule.get(rule, [])),
                broken_backends=sorted(p.spec for p in proving),
                spec=[entry.cite() for entry in for_rule(rule, CATALOGUE)],
                exemption="not-checkable" if exempt else None,
                exemption_reason=exempt or None,
                gpu_only=bool(proving) and all(p.cuda for p in proving),
            )
        )
    return rows


def row_dict(row: Row) -> dict[str, Any]:
    return {**asdict(row), "status": row.status}


def render(rows: Sequence[Row], *, show_cases: bool = False) -> str:
    width = max(len(r.rule) for r in rows) + 2
    lines = [f"{'rule id':<{width}} level   cases  status             broken backend(s) / reason", "-" * 110]
    for row in rows:
        proof = ", ".join(b.split(":")[1] for b in row.broken_backends) or (row.exemption_reason or "")
        lines.append(f"{row.rule:<{width}} {row.level:<7} {len(row.cases):>5}  {row.status:<18} {proof}")
        if show_cases:
            lines += [f"{'':<{width}}   {case}" for case in row.cases]
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.status] = counts.get(row.status, 0) + 1
    lines += ["", "summary: " + ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))]
    return "\n".join(lines)


def main(
    argv: Sequence[str] | None = None,
    proofs: Sequence[Proof] | None = None,
    prog: str = "python -m conformance.rule_coverage",
) -> int:
    """The table; ``proofs`` are the broken backends, which ``python -m tests.rule_coverage`` passes in."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Every rule id, the cases that check it and the broken backends that prove a chapter "
        "fails on it (read from the code; the broken backends are given by python -m tests.rule_coverage).",
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--cases", action="store_true", help="list every case under its rule")
    parser.add_argument("-o", "--output", type=Path, help="write the table to this file (default: stdout)")
    args = parser.parse_args(argv)
    if proofs is None:
        print(
            "note: no broken backends given (they live in tests/, which product code never imports): the "
            "statuses below count none; python -m tests.rule_coverage gives them",
            file=sys.stderr,
        )
    rows = coverage_rows(proofs=proofs or ())
    if args.json:
        text = json.dumps([row_dict(r) for r in rows], indent=2)
    else:
        text = render(rows, show_cases=args.cases)
    if args.output is None:
        print(text)
    else:  # the front door runs it in the background, its stderr in a log: the table apart
        args.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
