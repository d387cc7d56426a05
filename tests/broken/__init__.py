"""Deliberately broken backends, one module per area (``tests/broken/<area>.py``, spec
``tests.broken.<area>:NAME``): each wraps the reference and slips one way, declaring (``breaks``) the rules
a chapter must fail it on. ``python -m tests.rule_coverage`` finds them here; ``tests/conformance/`` and
``tests/harness/`` (faults) run them."""
