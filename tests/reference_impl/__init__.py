"""Self-tests of our backend (``reference_impl/``): the program format, the artifact cache, lowering,
the runtime and the ``mm_out`` shims."""
