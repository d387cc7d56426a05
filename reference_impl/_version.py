"""The reference backend's version, in a leaf module: the lowering stamps it without importing the backend."""

__version__ = "0.1.0"
