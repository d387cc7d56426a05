"""The phases of a conformance run, as ``nox -s conformance`` (its matrix cells, conformance_executorch) runs
them; ``noxfile.py`` only picks the session and passes its arguments.

* ``sizing``: how many processes a run starts: case workers and pre-lowering jobs, from cores and memory;
* ``plan``: what a session asks for (``SuiteRun``) and the pytest phases it becomes (``PytestPhase``);
* ``prelowering``: the background compile processes, and the toolchain preflight started beside them;
* ``record``: what the phases did, as they go (the phase table, exit codes, shards started);
* ``run``: the run itself, step by step, under one deadline (``run_suite``);
* ``report``: after the phases, whatever stopped them: result files, the page, the table, the verdict;
* ``console``: what the run needs of the tool that started it (nox's session, adapted in noxfile.py).

Nothing here imports nox or a backend, and only the standard library and standard-library-only harness
modules: nox imports this package with whatever interpreter runs nox, which may have no torch.
"""
