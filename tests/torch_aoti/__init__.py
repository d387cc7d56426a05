"""Self-tests of the PyTorch AOTInductor adapter (``torch_aoti/``)."""
