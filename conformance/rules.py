"""Rule levels: every rule id is *must* (a wrong result, aliasing, a crash, lost or changed data, a missing
contract error) or *should* (a conservative policy, a missing optimisation, a performance contract).

A failed *must* rule fails the run; a failed *should* rule is reported apart (outcome ``should-failed``)
and fails the run only with ``--strict-should``. Op coverage ("op X is not mapped") is neither: chapters
report it with ``checks.coverage_gap`` (outcome ``coverage``) and it never fails a run.

``python -m conformance.rules`` prints the patterns below and every rule id the chapters use, with levels.
"""

from __future__ import annotations

import fnmatch
import re
import sys
from collections.abc import Iterable, Sequence
from enum import Enum
from pathlib import Path


class Level(str, Enum):
    MUST = "must"
    SHOULD = "should"


#: Rule-id patterns (fnmatch) that are *should*; every other rule id is *must*.
SHOULD_RULES: tuple[str, ...] = (
    # --- view pass (conformance/view_pass_cases.py) ---
    # A copy the spec refuses conservatively (no schema, a view user, a container it cannot see through)
    # became a view and the result is still right; a wrong result stays the must rule view-pass/<rule>.
    "view-pass/*/policy",
    # A safe copy the backend maps but refused: a missing optimisation (an unmapped op is coverage).
    "view-pass/*/missed-rewrite",
    # The rewritten list disagrees with the result graph: the report is off, the program is not.
    "view-pass/report",
    # The report contradicts itself (a node both rewritten and refused) or names nodes the result lacks.
    "differential/view-pass-report",
    # --- end view pass ---
    # --- runtime and device placement ---
    # Host staging through pinned memory is a performance contract: pageable copies are slower, not wrong.
    "copies/pinned-host-memory",
    # The option kept the outputs on the device (skip-copy/output-device, a must) yet the profiler saw a
    # device->host copy: bandwidth wasted, nothing the caller gets is wrong.
    "skip-copy/no-d2h-copy",
    # The same for export-time device placement: values and placement are must rules of their own.
    "placement/no-d2h-copy",
    "placement/no-h2d-copy",
    # What NVML saw cross PCIe did not drop by the kept tensors' bytes: staged through the host anyway.
    "placement/pcie",
    "skip-copy/pcie",
    # Prefill/decode keep their KV caches on the GPU: the optimisation the skip-copy option exists for.
    # The tokens (multi-method/tokens) and the byte counters' truth (multi-method/h2d-bytes, d2h-bytes)
    # stay must.
    "multi-method/kv-cache-on-device",
    # --- end runtime and device placement ---
    # --- lowering ---
    # A backend that cannot lower a model said so clearly, but as RuntimeError, not the protocol's
    # ValueError (upstream ExecuTorch: "Method ... missing fallback kernels"): a contract nit, not a hazard.
    "lowering/unsupported-is-valueerror",
    # --- end lowering ---
    # --- mm_out ---
    # mm_out returns once the work is enqueued: a shim that drains the stream first is slower, not wrong
    # (the values are checked by mm_out/current-stream, a must).
    "mm_out/no-host-sync",
    # --- end mm_out ---
    # --- traffic meter ---
    # The counter direction differs from NVML's documentation; the meter follows its calibration, so the
    # figures stay correct: a note for whoever maintains the driver, not a wrong measurement.
    "traffic/direction",
    # --- end traffic meter ---
)

#: ``[rule-id]`` at the start of a failure message.
_RULE_ID = re.compile(r"^\[([^\[\]\s]+)\]")
#: Rule ids as the chapters write them: ``"chapter/rule"`` literals and ``f"chapter/{...}"`` templates.
_RULE_LITERAL = re.compile(r"""f?["']([a-z][a-z0-9_]*(?:-[a-z0-9_]+)*/[a-z0-9{][a-z0-9_.{}-]*)["']""")
_NOT_RULES = frozenset({"n/a"})
#: Files whose "a/b" strings are not rule ids (view-pass case names; this file's own examples).
_NOT_RULE_FILES = frozenset({"rules.py", "view_pass_cases.py"})


def level_of(rule: str) -> Level:
    """The level of rule id ``rule`` (the text between the brackets of a failure message)."""
    return Level.SHOULD if any(fnmatch.fnmatchcase(rule, p) for p in SHOULD_RULES) else Level.MUST


def rule_of(message: str) -> str | None:
    """The rule id a failure message starts with: ``[mm_out/values] mm_out(..): ..`` -> ``mm_out/values``."""
    match = _RULE_ID.match(message.lstrip())
    return match.group(1) if match else None


def rule_ids_in_sources(paths: Iterable[Path]) -> dict[str, list[str]]:
    """Rule ids (or f-string templates such as ``mm_out/{rule}``) written in ``paths`` -> files using them."""
    found: dict[str, list[str]] = {}
    for path in sorted(paths):
        if path.name in _NOT_RULE_FILES:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        for match in _RULE_LITERAL.finditer(text):
            rule = match.group(1)
            if rule in _NOT_RULES or rule.endswith((".py", "/")) or "//" in rule:
                continue
            users = found.setdefault(rule, [])
            if path.name not in users:
                users.append(path.name)
    return dict(sorted(found.items()))


def table(patterns: Sequence[str] = SHOULD_RULES, rule_ids: dict[str, list[str]] | None = None) -> str:
    """The text ``python -m conformance.rules`` prints."""
    lines = ["rule-id pattern                          level", "-" * 48]
    lines += [f"{pattern:<40} {Level.SHOULD.value}" for pattern in patterns]
    lines.append(f"{'* (every other rule id)':<40} {Level.MUST.value}")
    if rule_ids:
        width = max(len(rule) for rule in rule_ids) + 2
        lines += ["", f"{'rule id used by the chapters':<{width}} level   files", "-" * (width + 30)]
        for rule, files in rule_ids.items():
            lines.append(f"{rule:<{width}} {level_of(rule).value:<7} {', '.join(files)}")
        lines.append("")
        lines.append("Ids with {...} are templates filled at run time; their level is that of the filled id.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print("usage: python -m conformance.rules\n")
        print("Prints the rule-id patterns and their levels (should/must), then every rule id the")
        print("chapters in conformance/ use, with its level.")
        return 0
    here = Path(__file__).parent
    print(table(SHOULD_RULES, rule_ids_in_sources(here.glob("*.py"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
