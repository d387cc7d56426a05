"""A phase started early waits at its gate (harness/start_gate.py, runner/early.py): the gate
itself, then a real pytest run with an xdist worker, held until the gate opens, and one ended at it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.start_gate import (
    GATE_ENV,
    THREADS_ENV,
    WARM_ENV,
    WARM_IMPORTS,
    FrontDoorGone,
    gate_value,
    held_setup,
    held_threads,
    open_gate,
    take_threads,
    wait_for_gate,
    warm_imports,
    while_held,
)
from runner import early
from runner.plan import PytestPhase

ROOT = Path(__file__).resolve().parents[2]


def test_no_gate_or_an_unreadable_one_starts_at_once(tmp_path: Path) -> None:
    assert wait_for_gate({}) is None
    assert wait_for_gate({GATE_ENV: str(tmp_path / "gate")}) is None  # no pid: not a gate value
    assert wait_for_gate({GATE_ENV: "12:"}) is None


def test_the_wait_ends_when_the_gate_opens(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    timer = threading.Timer(0.3, open_gate, args=(gate,))
    timer.start()
    waited = wait_for_gate({GATE_ENV: gate_value(gate)}, poll_s=0.01, warm=[])
    assert waited is not None
    assert waited >= 0.25
    assert gate_value(gate, 7) == f"7:{gate}"


def test_a_held_process_waits_on_one_thread_and_takes_its_own_count_once_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert held_threads({"OMP_NUM_THREADS": "8"}) == {"OMP_NUM_THREADS": "1", THREADS_ENV: "8"}
    assert held_threads({}) == {"OMP_NUM_THREADS": "1", THREADS_ENV: str(os.cpu_count())}  # torch's default
    gate, taken = tmp_path / "gate", []
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(set_num_threads=taken.append))
    timer = threading.Timer(0.2, open_gate, args=(gate,))
    timer.start()
    wait_for_gate({GATE_ENV: gate_value(gate), THREADS_ENV: "8"}, poll_s=0.01, warm=[])
    assert taken == [8]  # after the gate opened
    assert wait_for_gate({THREADS_ENV: "8"}) is None
    assert taken == [8]  # no gate: no wait, nothing changed
    assert take_threads({THREADS_ENV: "none"}) is None
    monkeypatch.delitem(sys.modules, "torch")
    assert take_threads({THREADS_ENV: "8"}) is None  # torch not imported: nothing to set
    assert taken == [8]


def test_the_count_taken_at_the_gate_is_torchs() -> None:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    try:
        assert take_threads({THREADS_ENV: "3"}) == 3
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_a_gate_whose_opener_is_gone_ends_the_wait(tmp_path: Path) -> None:
    with pytest.raises(FrontDoorGone, match="pid 4242"):
        wait_for_gate(
            {GATE_ENV: gate_value(tmp_path / "gate", 4242)}, poll_s=0.01, alive=lambda pid: False, warm=[]
        )


def test_a_held_process_imports_the_warm_modules_and_only_a_held_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "warm_probe_held.py").write_text("")
    (tmp_path / "warm_probe_free.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    gate = tmp_path / "gate"
    open_gate(gate)
    try:
        assert wait_for_gate({GATE_ENV: gate_value(gate)}, poll_s=0.01, warm=["warm_probe_held"]) is not None
        assert "warm_probe_held" in sys.modules
    finally:
        sys.modules.pop("warm_probe_held", None)
    assert wait_for_gate({}, warm=["warm_probe_free"]) is None  # no gate: starts at once, imports nothing
    assert "warm_probe_free" not in sys.modules


def test_the_environment_names_the_warm_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "warm_probe_listed.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    gate = tmp_path / "gate"
    open_gate(gate)
    try:
        env = {GATE_ENV: gate_value(gate), WARM_ENV: " warm_probe_listed, "}
        assert wait_for_gate(env, poll_s=0.01) is not None
        assert "warm_probe_listed" in sys.modules
    finally:
        sys.modules.pop("warm_probe_listed", None)
    assert wait_for_gate({GATE_ENV: gate_value(gate), WARM_ENV: ""}, poll_s=0.01) is not None  # none


def test_a_warm_import_that_fails_is_named_and_does_not_hold_the_phase(tmp_path: Path) -> None:
    failed = warm_imports(["json", "no_such_module_for_the_gate"])
    assert failed == [
        "no_such_module_for_the_gate: ModuleNotFoundError: No module named 'no_such_module_for_the_gate'"
    ]
    gate = tmp_path / "gate"
    open_gate(gate)
    waited = wait_for_gate({GATE_ENV: gate_value(gate)}, poll_s=0.01, warm=["no_such_module_for_the_gate"])
    assert waited is not None


def test_a_held_phase_runs_its_selected_modules_setup_and_a_failing_one_is_left_to_its_case(
    tmp_path: Path,
) -> None:
    ran: list[str] = []

    def setup(name: str, fails: BaseException | None = None) -> Callable[[object], None]:
        def prepare(config: object) -> None:
            ran.append(f"{name} {config}")
            if fails is not None:
                raise fails

        prepare.__module__ = f"gate_probe_{name}"
        return while_held(prepare)

    setup("selected"), setup("failing", RuntimeError("no pinned memory")), setup("deselected")
    setup("skipping", pytest.skip.Exception("no GPU"))  # pytest's outcomes are BaseExceptions
    chosen = held_setup(
        ["gate_probe_failing", "gate_probe_selected", "gate_probe_failing", "gate_probe_skipping"]
    )
    assert len(chosen) == 3  # each module once, the deselected one not at all
    assert wait_for_gate({}, setup=chosen) is None
    assert ran == []  # no gate: the fixtures ask for it in their own time
    gate = tmp_path / "gate"
    open_gate(gate)
    waited = wait_for_gate({GATE_ENV: gate_value(gate)}, poll_s=0.01, warm=[], setup=chosen, config="cfg")
    assert waited is not None
    assert ran == ["failing cfg", "selected cfg", "skipping cfg"]  # given the config; failures held nothing


def test_the_warm_modules_import_with_this_torch() -> None:
    failed = warm_imports(WARM_IMPORTS)
    if importlib.util.find_spec("transformers") is None:  # the zoo's extra (pyproject ``hf``) is not here
        failed = [f for f in failed if not f.startswith("transformers.")]
    assert failed == []


class _Console:
    """The parts of the run's console that ``early`` uses, with real processes."""

    def __init__(self) -> None:
        self.shown: list[str] = []

    def start(self, cmd: Sequence[str], *, env: Mapping[str, str], output: Path) -> subprocess.Popen[bytes]:
        with open(output, "wb") as out:
            return subprocess.Popen(cmd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)

    def echo(self, text: str) -> None:
        self.shown.append(text)


def _phase(tmp_path: Path) -> tuple[PytestPhase, list[str], Path]:
    """A one-case chapter whose case notes when it ran, and its phase's pytest command (one xdist worker,
    the results plugin: the plugin holds each worker at the gate)."""
    ran, prepared = tmp_path / "ran", tmp_path / "prepared"
    chapter = tmp_path / "test_chapter.py"
    collected = tmp_path / "collected"
    chapter.write_text(
        f"import time\nfrom harness import start_gate\nopen({str(collected)!r}, 'w').close()\n\n"
        f"@start_gate.while_held\ndef prepare(config):\n    open({str(prepared)!r}, 'w').close()\n\n"
        f"def test_notes_when_it_ran():\n    open({str(ran)!r}, 'w').write(str(time.time()))\n"
    )
    results = tmp_path / "results"
    results.mkdir()
    phase = PytestPhase("cases (GPU alone)", "alone", 1, "", "1 worker(s)")
    cmd = [
        sys.executable, "-m", "pytest", str(chapter), "-n", "1", "-p", "harness.pytest_plugin",
        f"--results-json={results / 'alone.json'}", f"--rootdir={tmp_path}", "-p", "no:cacheprovider",
    ]  # fmt: skip
    return phase, cmd, ran


@pytest.mark.proof  # a real pytest phase, its xdist worker and the plugin: 14-35 s on two cores
def test_a_phase_started_early_runs_its_cases_only_once_released(tmp_path: Path) -> None:
    phase, cmd, ran = _phase(tmp_path)
    console = _Console()
    env = {"PYTHONPATH": str(ROOT), WARM_ENV: ""}  # the gate is tested here, not dynamo's import (4 s)
    started = early.start_early(console, phase, cmd, env, tmp_path / "results")  # type: ignore[arg-type]
    deadline = time.monotonic() + 60
    while not (tmp_path / "collected").exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # the worker imports the chapter: it is collecting
    time.sleep(1.5)  # without a gate, its one case would have run by now
    assert started.process.poll() is None  # held at the gate ...
    assert not ran.exists()  # ... its case not run ...
    assert (tmp_path / "prepared").exists()  # ... its module's held setup done
    opened = time.time()
    code = early.release(console, started, interrupt_s=2, terminate_s=10)  # type: ignore[arg-type]
    assert code == 0
    assert float(ran.read_text()) >= opened
    assert "1 passed" in "".join(console.shown)
    assert (tmp_path / "results" / "alone.json").exists()
    assert not started.gate.parent.exists()


def test_a_phase_ended_at_its_gate_leaves_no_result_file(tmp_path: Path) -> None:
    phase, cmd, ran = _phase(tmp_path)
    console = _Console()
    env = {"PYTHONPATH": str(ROOT)}
    started = early.start_early(console, phase, cmd, env, tmp_path / "results")  # type: ignore[arg-type]
    time.sleep(2)
    early.cancel(started)
    assert started.process.poll() is not None
    assert not ran.exists()
    assert not any(path.exists() for path in started.files)
    assert started.output.exists()  # its console output is kept
