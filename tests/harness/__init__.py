"""Self-tests of ``harness/``: the backend loader, the result file and its plugin, the run's phases, its end
(watchdog, faults, signals), progress, timing, the bench and the PCIe meter."""
