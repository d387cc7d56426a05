"""Self-tests of the upstream ExecuTorch adapter (``upstream_executorch/``)."""
