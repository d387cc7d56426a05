"""``python -m reports RESULTS.json [more.json ...] -o site/index.html``: render the HTML summary.

Several files (shards) are merged into one page. A file that is not a readable result file ends the
command with exit status 2 and a one-line error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from harness.results import ResultFileError, atomic_write_text, load_results, merge_runs
from reports.summary import render_summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reports", description="Render the results summary page.")
    parser.add_argument("results", nargs="+", help="result JSON file(s); several are merged as shards")
    parser.add_argument("-o", "--output", default="site/index.html", help="HTML file to write (%(default)s)")
    args = parser.parse_args(argv)
    try:
        run = merge_runs([load_results(path) for path in args.results])
    except ResultFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        atomic_write_text(args.output, render_summary(run, args.results))
    except OSError as exc:
        print(f"error: cannot write {args.output}: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.output} ({len(run.cases)} cases{'' if run.complete else ', incomplete run'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
