"""The versioned result file: schema, validation, atomic writes, a crash-safe journal, and shard merging.

A run writes ``<path>.journal.jsonl`` line by line while it goes (each line fsynced), then the final
``<path>`` atomically at the end. A killed run therefore leaves its journal, which ``load_results`` turns
back into an incomplete ``RunResult``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

import settings
from harness.outcomes import FAILING, NOT_CHECKING, Outcome

SCHEMA = "aoti-conformance-results"
#: Version 2 added the case fields ``rule``, ``level`` and ``known_failure`` and the outcomes
#: ``should-failed`` and ``coverage``. Version 3 added the outcomes ``timeout``, ``device-fault`` and
#: ``not-run``, the case field ``evidence`` and the journal line kind ``collected``. Older files are read
#: as version 3 cases without the new fields.
SCHEMA_VERSION = 3
SUPPORTED_SCHEMA_VERSIONS: tuple[int, ...] = (1, 2, 3)
#: Every outcome as the file spells it, in the order ``RunResult.summary()`` counts them. Plain strings
#: (what a file holds, what a ``repr`` or a cache key shows); what each means: ``harness.outcomes``.
OUTCOMES: tuple[str, ...] = tuple(outcome.value for outcome in Outcome)
#: Outcomes that mean the backend did something wrong (they fail a run); one list for every reader.
FAILING_OUTCOMES: tuple[str, ...] = tuple(outcome.value for outcome in Outcome if outcome in FAILING)
#: Levels of the rule a failure names (``conformance/common/rules.py``).
LEVELS: tuple[str, ...] = ("must", "should")
JOURNAL_SUFFIX = ".journal.jsonl"


class ResultFileError(ValueError):
    """A result file or journal that cannot be read as this schema; the message says why."""


@dataclass
class CaseResult:
    """One test case: what ran, how it ended, and how to run it again."""

    id: str
    chapter: str
    params: dict[str, str]
    #: An ``Outcome``: a member where it was recorded, its plain string where read back (the two are equal).
    outcome: str
    message: str
    repro: str
    duration_s: float
    worker: str | None
    #: The rule id the failure (or coverage gap) named, ``[rule-id]`` at the start of its message.
    rule: str | None = None
    #: ``must`` or ``should`` for a failed, should-failed or known-failing case; None otherwise.
    level: str | None = None
    #: For a declared known failure (outcome ``xfailed``, or ``failed`` with rule ``known-failures/stale``):
    #: the entry, ``{"case", "rule", "reason", "link", "source"}``.
    known_failure: dict[str, Any] | None = None
    #: Seconds from the run's start (the recording process's session start) to the case's setup: with
    #: ``worker`` and ``duration_s``, each worker's timeline (where a run's wall time went).
    started_s: float | None = None
    #: What a fault left behind, for the reader to judge it: every thread's stack at a ``timeout``, the
    #: CUDA error at a ``device-fault``. None for every other case.
    evidence: str | None = None
    #: A check of the test suite itself (marked ``suite_check``): no backend involved, so its outcome is
    #: the suite's, never the backend's (``RunResult.summary`` counts it apart).
    suite_check: bool = False

    @property
    def exercised(self) -> bool:
        """The case checked the backend under test: not a suite check, and not skipped, a coverage gap or
        not run (``NOT_CHECKING``)."""
        return not self.suite_check and self.outcome not in NOT_CHECKING


@dataclass
class RunResult:
    """One pytest run (or several merged shards)."""

    schema: str
    schema_version: int
    run_id: str
    started_at: str
    finished_at: str | None
    complete: bool
    environment: dict[str, Any]
    metadata: dict[str, Any]
    cases: list[CaseResult] = field(default_factory=list)
    benchmarks: list[dict[str, Any]] = field(default_factory=list)
    traffic: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Counts per outcome (every outcome present, zeros included) and per chapter, of the cases that
        judge the backend; the suite's own checks apart (``suite_checks``: the outcomes that occurred)."""
        outcomes = dict.fromkeys(OUTCOMES, 0)
        chapters: dict[str, dict[str, int]] = {}
        suite: dict[str, int] = {}
        for case in self.cases:
            if case.suite_check:
                suite[case.outcome] = suite.get(case.outcome, 0) + 1
                continue
            outcomes[case.outcome] = outcomes.get(case.outcome, 0) + 1
            per_chapter = chapters.setdefault(case.chapter, dict.fromkeys(OUTCOMES, 0))
            per_chapter[case.outcome] = per_chapter.get(case.outcome, 0) + 1
        return {
            "total": len(self.cases) - sum(suite.values()),
            "outcomes": outcomes,
            "chapters": dict(sorted(chapters.items())),
            "suite_checks": suite,
        }

    def exercised(self) -> bool:
        """Whether any case checked the backend under test (see ``CaseResult.exercised``)."""
        return any(case.exercised for case in self.cases)


def utc_now() -> str:
    """An ISO 8601 UTC timestamp, second precision: what every timestamp in the file looks like."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


#: Set by the front door for every pytest run of one ``nox -s conformance``: its shards share one run id, so
#: every reader (the report, the dashboard) merges them into one run without being told. A CI system that
#: spreads the matrix cells over several runners sets it itself, one value for all of them: the front door
#: then passes it on, and the cells' files merge into one run too.
RUN_ID_ENV = settings.RUN_ID.name


def new_run_id() -> str:
    """``$CONFORMANCE_RUN_ID`` when the front door set it, else sortable by time and unique enough across
    shards started in the same second."""
    shared = os.environ.get(RUN_ID_ENV, "").strip()
    if shared:
        return shared
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def new_run(environment: dict[str, Any], metadata: dict[str, Any] | None = None) -> RunResult:
    """A run that has just started: no cases yet, not complete."""
    return RunResult(
        schema=SCHEMA,
        schema_version=SCHEMA_VERSION,
        run_id=new_run_id(),
        started_at=utc_now(),
        finished_at=None,
        complete=False,
        environment=environment,
        metadata=dict(metadata or {}),
    )


def journal_path(path: str | os.PathLike[str]) -> Path:
    """The journal that sits beside the final result file."""
    return Path(str(path) + JOURNAL_SUFFIX)


# ---------------------------------------------------------------------------------------------- writing


def run_to_dict(run: RunResult) -> dict[str, Any]:
    return dataclasses.asdict(run)


def dumps_run(run: RunResult) -> str:
    return json.dumps(run_to_dict(run), sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write via a temp file in the same directory, fsync, then rename: readers never see half a file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        # mkstemp creates 0600; a result file is meant to be read by CI publishers and other users.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as tmp:
            tmp.write(text)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    _fsync_directory(target.parent)


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable; not possible on every platform, and never worth failing over.
    with contextlib.suppress(OSError):
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def write_results(path: str | os.PathLike[str], run: RunResult) -> None:
    atomic_write_text(path, dumps_run(run))


class ResultJournal:
    """Append-only JSON lines beside the result file; every line is flushed and fsynced at once.

    Line kinds: ``header`` (first line: schema, run id, start time, environment, metadata), ``metadata``
    (one key added later), ``collected`` (the ids of the cases the run will run, once known), ``case``,
    ``benchmark`` and ``traffic``. A journal rebuilt into a run (``load_journal``) lists every collected case
    that has no ``case`` line as ``not-run``: the process ended before it.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = journal_path(path)
        self._file: TextIO | None = None

    def start(self, run: RunResult) -> None:
        """Truncate any journal left by an earlier run and write the header."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - held open for the whole run
        self._append(
            {
                "kind": "header",
                "schema": run.schema,
                "schema_version": run.schema_version,
                "run_id": run.run_id,
                "started_at": run.started_at,
                "environment": run.environment,
                "metadata": run.metadata,
            }
        )

    @property
    def is_open(self) -> bool:
        return self._file is not None

    def add_metadata(self, key: str, value: Any) -> None:
        self._append({"kind": "metadata", "key": key, "value": value})

    def add_collected(self, ids: Sequence[str]) -> None:
        self._append({"kind": "collected", "ids": list(ids)})

    def add_case(self, case: CaseResult) -> None:
        self._append({"kind": "case", "case": dataclasses.asdict(case)})

    def add_benchmark(self, entry: dict[str, Any]) -> None:
        self._append({"kind": "benchmark", "entry": entry})

    def add_traffic(self, entry: dict[str, Any]) -> None:
        self._append({"kind": "traffic", "entry": entry})

    def _append(self, record: dict[str, Any]) -> None:
        if self._file is None:
            raise RuntimeError("ResultJournal.start() must be called before appending")
        self._file.write(json.dumps(record, sort_keys=True, ensure_ascii=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def discard(self) -> None:
        """Close and delete: called once the final result file is safely written."""
        self.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


# ---------------------------------------------------------------------------------------------- reading


def load_results(path: str | os.PathLike[str]) -> RunResult:
    """Read a final result file, or rebuild an incomplete run from its journal when the run never finished."""
    target = Path(path)
    if target.exists():
        try:
            text = target.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ResultFileError(f"{target}: cannot read: {exc}") from exc
        return parse_results(text, source=str(target))
    journal = journal_path(target)
    if journal.exists():
        return load_journal(journal)
    raise ResultFileError(f"{target}: no such result file (and no journal {journal.name} beside it)")


def parse_results(text: str, source: str = "<string>") -> RunResult:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultFileError(f"{source}: not valid JSON ({exc}); the file may be truncated") from exc
    return run_from_dict(data, source)


def run_from_dict(data: object, source: str = "<data>") -> RunResult:
    """Validate a decoded result file; every problem becomes a ResultFileError naming the field."""
    obj = _expect_object(data, source, "the top level")
    _check_schema(obj, source)
    _require(obj, source, "", _RUN_FIELDS)
    cases_raw = obj["cases"]
    cases = [_case_from_dict(item, source, f"cases[{i}]") for i, item in enumerate(cases_raw)]
    for name in ("benchmarks", "traffic"):
        for i, entry in enumerate(obj[name]):
            _expect_object(entry, source, f"{name}[{i}]")
    return RunResult(
        schema=obj["schema"],
        schema_version=obj["schema_version"],
        run_id=obj["run_id"],
        started_at=obj["started_at"],
        finished_at=obj["finished_at"],
        complete=obj["complete"],
        environment=obj["environment"],
        metadata=obj["metadata"],
        cases=cases,
        benchmarks=list(obj["benchmarks"]),
        traffic=list(obj["traffic"]),
    )


def load_journal(path: str | os.PathLike[str]) -> RunResult:
    """Rebuild a run from a journal; a truncated last line (the run died mid-write) is dropped."""
    source = str(path)
    try:
        raw = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ResultFileError(f"{source}: cannot read: {exc}") from exc
    lines = raw.split("\n")
    records: list[tuple[int, dict[str, Any]]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if all(not rest.strip() for rest in lines[number:]):
                break  # the last line was cut short by the crash
            raise ResultFileError(f"{source}:{number}: journal line is not valid JSON ({exc})") from exc
        records.append((number, _expect_object(record, source, f"journal line {number}")))
    if not records or records[0][1].get("kind") != "header":
        raise ResultFileError(f"{source}: journal has no header line; it is empty or not a result journal")
    header = records[0][1]
    _check_schema(header, source)
    _require(header, source, "journal header: ", _HEADER_FIELDS)
    run = RunResult(
        schema=header["schema"],
        schema_version=header["schema_version"],
        run_id=header["run_id"],
        started_at=header["started_at"],
        finished_at=None,
        complete=False,
        environment=header["environment"],
        metadata=dict(header["metadata"]),
    )
    collected: list[str] = []
    for number, record in records[1:]:
        _apply_journal_record(run, record, f"{source}:{number}", collected)
    add_not_run(run, collected, "the run's process ended before this case ended (from its journal)")
    return run


def add_not_run(run: RunResult, collected: Sequence[str], reason: str) -> list[CaseResult]:
    """Record every id of ``collected`` that ``run`` has no case for as ``not-run`` with ``reason``."""
    recorded = {case.id for case in run.cases}
    added = [not_run_case(case_id, reason) for case_id in dict.fromkeys(collected) if case_id not in recorded]
    run.cases.extend(added)
    return added


def not_run_case(case_id: str, reason: str, repro: str = "") -> CaseResult:
    """A case the run never finished."""
    return CaseResult(case_id, chapter_of(case_id), {}, Outcome.NOT_RUN, reason, repro, 0.0, None)


def chapter_of(nodeid: str) -> str:
    """``conformance/mm_out/test_mm_out.py::test_x[...]`` -> ``mm_out``; any other file -> its stem."""
    stem = Path(nodeid.split("::", 1)[0]).stem
    return stem.removeprefix("test_") if stem.startswith("test_") and stem != "test_" else stem


def _apply_journal_record(run: RunResult, record: dict[str, Any], where: str, collected: list[str]) -> None:
    kind = record.get("kind")
    if kind == "collected":
        ids = record.get("ids")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise ResultFileError(f"{where}: collected line: field 'ids' must be an array of strings")
        collected.extend(ids)
    elif kind == "case":
        run.cases.append(_case_from_dict(record.get("case"), where, "case"))
    elif kind == "metadata":
        _require(record, where, "metadata line: ", {"key": (str,)})
        run.metadata[record["key"]] = record.get("value")
    elif kind in ("benchmark", "traffic"):
        entry = _expect_object(record.get("entry"), where, f"{kind} entry")
        (run.benchmarks if kind == "benchmark" else run.traffic).append(entry)
    else:
        raise ResultFileError(f"{where}: unknown journal line kind {kind!r}")


# Field name -> accepted types. bool is rejected where int is wanted (see _type_ok).
_RUN_FIELDS: dict[str, tuple[type, ...]] = {
    "run_id": (str,),
    "started_at": (str,),
    "finished_at": (str, type(None)),
    "complete": (bool,),
    "environment": (dict,),
    "metadata": (dict,),
    "cases": (list,),
    "benchmarks": (list,),
    "traffic": (list,),
}
_HEADER_FIELDS: dict[str, tuple[type, ...]] = {
    "run_id": (str,),
    "started_at": (str,),
    "environment": (dict,),
    "metadata": (dict,),
}
_CASE_FIELDS: dict[str, tuple[type, ...]] = {
    "id": (str,),
    "chapter": (str,),
    "params": (dict,),
    "outcome": (str,),
    "message": (str,),
    "repro": (str,),
    "duration_s": (int, float),
    "worker": (str, type(None)),
}
#: Case fields added in version 2: optional (absent in version 1 files), None when not applicable.
_OPTIONAL_CASE_FIELDS: dict[str, tuple[type, ...]] = {
    "rule": (str, type(None)),
    "level": (str, type(None)),
    "known_failure": (dict, type(None)),
    "started_s": (int, float, type(None)),
    "evidence": (str, type(None)),
    "suite_check": (bool,),
}


def _type_ok(value: object, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def _type_names(types: tuple[type, ...]) -> str:
    names = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}
    return " or ".join(names.get(t, "null") for t in types)


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    return _type_names((type(value),)) if type(value) in (str, int, float, bool, dict, list) else "other"


def _expect_object(value: object, source: str, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ResultFileError(f"{source}: {what} must be a JSON object, found {_json_type(value)}")
    return value


def _require(
    obj: Mapping[str, Any], source: str, prefix: str, fields: Mapping[str, tuple[type, ...]]
) -> None:
    missing = [name for name in fields if name not in obj]
    if missing:
        raise ResultFileError(f"{source}: {prefix}missing field(s): {', '.join(missing)}")
    for name, types in fields.items():
        if not _type_ok(obj[name], types):
            raise ResultFileError(
                f"{source}: {prefix}field {name!r} must be {_type_names(types)}, "
                f"found {_json_type(obj[name])}"
            )


def _check_schema(obj: Mapping[str, Any], source: str) -> None:
    schema = obj.get("schema")
    if schema != SCHEMA:
        raise ResultFileError(
            f"{source}: not a conformance result file (schema is {schema!r}, want {SCHEMA!r})"
        )
    version = obj.get("schema_version")
    if not _type_ok(version, (int,)) or version not in SUPPORTED_SCHEMA_VERSIONS:
        supported = ", ".join(str(v) for v in SUPPORTED_SCHEMA_VERSIONS)
        raise ResultFileError(
            f"{source}: unsupported schema_version {version!r}; this tool reads version(s) {supported}"
        )


def _case_from_dict(data: object, source: str, where: str) -> CaseResult:
    obj = _expect_object(data, source, where)
    _require(obj, source, f"{where}: ", _CASE_FIELDS)
    if obj["outcome"] not in OUTCOMES:
        raise ResultFileError(
            f"{source}: {where}: outcome {obj['outcome']!r} is not one of {', '.join(OUTCOMES)}"
        )
    for key, value in obj["params"].items():
        if not isinstance(value, str):
            raise ResultFileError(
                f"{source}: {where}: params[{key!r}] must be string, found {_json_type(value)}"
            )
    _require(obj, source, f"{where}: ", {k: t for k, t in _OPTIONAL_CASE_FIELDS.items() if k in obj})
    if obj.get("level") is not None and obj["level"] not in LEVELS:
        raise ResultFileError(f"{source}: {where}: level {obj['level']!r} is not one of {', '.join(LEVELS)}")
    return CaseResult(
        id=obj["id"],
        chapter=obj["chapter"],
        params=dict(obj["params"]),
        outcome=obj["outcome"],
        message=obj["message"],
        repro=obj["repro"],
        duration_s=float(obj["duration_s"]),
        worker=obj["worker"],
        rule=obj.get("rule"),
        level=obj.get("level"),
        known_failure=obj.get("known_failure"),
        started_s=None if obj.get("started_s") is None else float(obj["started_s"]),
        evidence=obj.get("evidence"),
        suite_check=bool(obj.get("suite_check", False)),
    )


# ---------------------------------------------------------------------------------------------- merging


def merge_runs(runs: Sequence[RunResult]) -> RunResult:
    """Shards (one per GPU or host) as one run: cases concatenated, each shard's environment kept.

    Environment and metadata keys on which every shard agrees are also kept at the top level, so a
    dashboard header reads the same for one shard or many. A single run is returned unchanged.
    """
    if not runs:
        raise ValueError("merge_runs needs at least one run")
    if len(runs) == 1:
        return runs[0]
    finished = [run.finished_at for run in runs]
    environment = _common_items(run.environment for run in runs)
    environment["shards"] = [run.environment for run in runs]
    metadata = _common_items(run.metadata for run in runs)
    metadata["shards"] = [{"run_id": run.run_id, **run.metadata} for run in runs]
    return RunResult(
        schema=SCHEMA,
        schema_version=SCHEMA_VERSION,
        run_id="merged:" + ",".join(run.run_id for run in runs),
        started_at=min(run.started_at for run in runs),
        finished_at=None if any(f is None for f in finished) else max(f for f in finished if f is not None),
        complete=all(run.complete for run in runs),
        environment=environment,
        metadata=metadata,
        # Worker ids restart in every shard (each has its gw0): qualify them with the shard they ran in.
        cases=[
            dataclasses.replace(case, worker=f"shard{n}/{case.worker}") if case.worker else case
            for n, run in enumerate(runs, start=1)
            for case in run.cases
        ],
        benchmarks=[entry for run in runs for entry in run.benchmarks],
        traffic=[entry for run in runs for entry in run.traffic],
    )


def _common_items(dicts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    all_dicts = list(dicts)
    first, rest = all_dicts[0], all_dicts[1:]
    return {
        key: value
        for key, value in first.items()
        if key != "shards" and all(key in other and other[key] == value for other in rest)
    }
