"""The checks and helpers chapters share, or share with benchmarks/ and the suite's plumbing; they import
no chapter and nothing of suite/ (tests/project/test_import_graph.py)."""
