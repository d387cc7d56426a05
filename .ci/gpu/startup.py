"""A warm run's start-up from its shared phase's files: when the fork server imported and forked, when the
workers' collections reached the controller and when the first case began, in seconds after the
controller's session began (``python3 .ci/gpu/startup.py RUN_FOLDER``; the folder suite.sh keeps)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def main(folder: Path) -> None:
    line = json.loads((folder / "conformance.json").read_text())["metadata"].get("timeline", {})
    zero = line["session_start"]
    stamps = {}
    log = folder / "conformance.forkserver.log"
    if log.exists():
        text = log.read_text()
        span = re.search(r"imported (\d+) modules in [\d.]+ s \(epoch ([\d.]+) to ([\d.]+)\)", text)
        if span:
            stamps[f"fork server: import of {span[1]} modules began"] = float(span[2])
            stamps["fork server: import done"] = float(span[3])
        fork = re.search(r"first worker forked at epoch ([\d.]+)", text)
        if fork:
            stamps["fork server: first worker forked"] = float(fork[1])
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
