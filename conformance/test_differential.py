"""Chapter differential — generated calls, judged by oracles instead of hand-picked examples (SPEC §1-§2).

Every other chapter checks one hand-picked shape of each rule. This one draws its inputs with Hypothesis
(``conformance/generation.py`` keeps a CI run deterministic and bounded) and judges every observable the
spec determines by an oracle: float64 eager PyTorch for values, the reference backend (run in a process of
its own, through the same protocol) for which calls are errors, and the spec itself for what a call may
change. A failing example is shrunk to the shortest sequence of calls that shows it.

Sections, each its own protocol part (a backend lacking one is skipped there, never failed):

* **view pass** (part ``view_pass``): generated edge graphs of ``*_copy`` ops, writes and outputs.
* **runtime** (parts ``lowering`` + ``runtime``): a state machine drives sequences of protocol calls.

Rules read ``differential/<rule>``; the differences the spec allows are listed once, in
``conformance/oracle.py``.
"""

from __future__ import annotations
