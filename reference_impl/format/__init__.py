"""The program format: the floor under the lowering and the runtime.

What the lowering writes and the runtime reads, so neither wing imports the other: the self-checking
envelope (``framing.py``), compile specs and method names (``compile_spec.py``), the per-method blob
(``blob.py``), the multi-method program file (``program.py``), the export-time placement record
(``placement.py``) and the format's errors (``errors.py``).

Nothing here imports a wing (``lowering``, ``runtime``, ``shims``): ``tests/test_import_graph.py`` holds it.
This ``__init__`` re-exports nothing, so importing one format module never pulls in another (nor torch).
"""
