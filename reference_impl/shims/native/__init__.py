"""The native C++ ``mm_out`` shim: source (``mm_out.cpp``), build and cache (``build.py``), loading and the
Python entry (``library.py``), and routing compiled programs to it (``routing.py``).

Importing this package builds and loads nothing.
"""
