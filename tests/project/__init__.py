"""Self-tests of the project as a whole: the front door (``noxfile.py``, real nox runs, sharding), the CI
workflow and its examples, and the import graph (layers, no cycles, product code never imports tests)."""
