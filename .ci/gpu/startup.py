"""A warm run's start-up from its shared phase's files: when the fork server imported and forked, when the
workers' collections reached the controller and when the first case began, in seconds after the
controller's session began (``python3 .ci/gpu/startup.py RUN_FOLDER``; the folder suite.sh keeps)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: its fork server's log reader

from harness.forkserver import first_fork_at, import_span


def main(folder: Path) -> None:
    line = json.loads((folder / "conformance.json").read_text())["metadata"].get("timeline", {})
    zero = line["session_start"]
    stamps = {}
    log = folder / "conformance.forkserver.log"
    if log.exists():
        text = log.read_text(errors="replace")
        span = import_span(text)
        if span is not None and span.began is not None and span.ended is not None:
            stamps[f"fork server: import of {span.modules} modules began"] = span.began
            stamps["fork server: import done"] = span.ended
        fork = first_fork_at(text)
        if fork is not None:
            stamps["fork server: first worker forked"] = fork
    for key, words in (
        ("first_collected", "first worker's collection in"),
        ("last_collected", "last worker's collection in"),
        ("first_case", "first case began"),
        ("last_case_end", "last case ended"),
        ("workers_done", "workers done"),
        ("final_write", "result file written"),
    ):
        if line.get(key) is not None:
            stamps[words] = line[key]
    print(f"{folder.name}: seconds after the shared phase's session began")
    for words, at in sorted(stamps.items(), key=lambda item: item[1]):
        print(f"  {at - zero:+7.2f}  {words}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
