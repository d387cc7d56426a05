"""The program format: the floor under the backend's wings (lowering, runtime, shims).

What the lowering writes and the runtime (and the native shim's router) read, so no wing imports another
for it: the self-checking envelope (``framing.py``), compile specs and method names (``compile_spec.py``),
the per-method blob (``blob.py``), the multi-method program file (``program.py``), the export-time
placement record (``placement.py``), a method's input/output spec (``iospec.py``), the AOTInductor package
a blob carries (its loader, ``package_loader.py``; its generated C++ read as text, ``cpp_source.py``), and
the errors: the containers' (``errors.py``) and the runtime argument errors the I/O spec raises
(``argument_errors.py``).

Nothing here imports a wing: ``tests/project/test_import_graph.py`` holds it. This ``__init__`` re-exports
nothing, so importing one format module never pulls in another (nor torch).
"""
