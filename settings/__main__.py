"""``python -m settings``: the project's environment settings and which this environment sets."""

from settings import main

if __name__ == "__main__":
    raise SystemExit(main())
