"""The phases of a conformance run (runner/), driven through a fake console: which pytest
phases a machine gets and with what, the pre-lowering and preflight around them, a stop mid-run, the
report and the verdict. No process runs here but a ``sleep`` to stop; tests/project/test_front_door.py and
tests/project/test_sharded_run.py drive the real front door (nox) end to end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from harness import forkserver
from harness.machine_limits import Cores
from harness.phases import Phase, parse_phase
from harness.run_control import EXIT_PREFLIGHT, EXIT_SIGTERM
from harness.start_gate import GATE_ENV
from runner import plan, prelowering, report, run, sizing
from runner.busy_sampler import TRACE_HEADER, BusySampler, ProcessState
from runner.forking import ForkServer
from runner.plan import PytestPhase, SuiteRun
from runner.prelowering import Prelowering
from runner.record import RunRecord
from tests.runner.run_phases_fakes import (
    STAMP,
    Failed,
    FakeBackground,
    FakeConsole,
    front_door_signals_restored,
)

ROOT = Path(__file__).resolve().parents[2]
#: Environment the front door reads; each test starts without it.
FRONT_DOOR_ENV = (
    "CONFORMANCE_RUN_ID",
    "CONFORMANCE_RUN_DEADLINE",
    "CONFORMANCE_PRELOWER",
    "CONFORMANCE_WORKERS_PER_GPU",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "CONFORMANCE_CUDA_SYNC",
)


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A 16-core machine with 125 GiB available, without the front door's variables; signal handlers as
    they were after."""
    for name in FRONT_DOOR_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sizing, "usable_cores", lambda: Cores(16))
    monkeypatch.setattr(sizing, "available_memory_gib", lambda: 125.0)
    # No /proc to sample: the tables' details are the phases' own (one test below samples).
    monkeypatch.setattr(run, "BusySampler", lambda **kw: BusySampler(scan=lambda: None, **kw))
    with front_door_signals_restored():
        yield


def _suite(tmp_path: Path, *posargs: str, prelower: bool = True) -> SuiteRun:
    return SuiteRun(tmp_path, "conformance", ("conformance",), "/venv/bin/python", posargs, prelower)


def _table(console: FakeConsole) -> list[Phase]:
    # Stored before the page (--no-print), then stored and printed with the report's own time.
    stored, cmd = [c for c in console.of("run") if "harness.phases" in c]  # type: ignore[operator]
    assert "--no-print" in stored
    return [parse_phase(a.removeprefix("--phase=")) for a in cmd if a.startswith("--phase=")]  # type: ignore[union-attr]


# ------------------------------------------------------------------------------------------------ whole runs


def test_without_a_gpu_the_run_is_one_phase_of_cpu_workers(tmp_path: Path) -> None:
    console = FakeConsole(gpus=0)
    run.run_suite(console, _suite(tmp_path))
    ((cmd, env),) = console.of("pytest")  # type: ignore[misc]
    assert cmd[:4] == ["/venv/bin/python", "-m", "pytest", "conformance"]
    assert cmd[4:10] == ["-n", "2", "--dist", "worksteal", "-m", "not multi_gpu"]
    assert "--no-preflight" not in cmd  # nothing checked the toolchain: the phase does
    assert env == {"CONFORMANCE_RUN_ID": env["CONFORMANCE_RUN_ID"]}
    assert env["CONFORMANCE_RUN_ID"].endswith("-conformance")
    assert [p.name for p in _table(console)] == ["cases", "report"]
    assert ("log", "no CUDA device; 2 pytest-xdist worker(s)") in console.calls
    archive = next(c for c in console.of("run") if "harness.run_history" in c)  # type: ignore[operator]
    assert archive[-3:] == [
        "--name=conformance",
        "--name=conformance-exclusive",
        "--name=conformance-multi-gpu",
    ]
    assert not console.of("error")


def test_two_gpus_get_the_shared_phase_with_the_multi_gpu_one_beside_then_the_alone_phase(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    background = FakeBackground(monkeypatch)
    console = FakeConsole(gpus=2)
    run.run_suite(console, _suite(tmp_path, "--backend", "my:BACKEND"))
    # asked first whether an earlier run lowered everything (not here), sized, then started
    assert background.events[:3] == [
        "is-done --backend my:BACKEND",
        "start --backend my:BACKEND",
        "preflight in group -1",  # the pre-lowering's (its fake process's pid): counted with it
    ]
    # the multi-GPU phase ran beside the shared one from its start; the GPU-alone phase started before the
    # shared one, held at its gate until after both; each one's output shown after the shared phase
    (multi, multi_env), (shared, shared_env), (alone, alone_env) = console.of("pytest")  # type: ignore[misc]
    shards = ["conformance-multi-gpu", "conformance-exclusive"]
    first_shared = console.calls.index(("pytest", (shared, shared_env)))
    assert console.calls.index(("started early", f"{shards[1]}.console.log")) < first_shared
    assert console.calls.index(("pytest", (multi, multi_env))) < first_shared
    assert console.of("echo") == [f"collected, waiting at the gate\n{shard} ran\n" for shard in shards]
    assert alone_env[GATE_ENV].startswith(f"{os.getpid()}:")
    assert GATE_ENV not in shared_env
    # 16 cores, 2 GPUs: 12 case workers (6 per GPU) and 15 compile processes at a lower priority
    assert shared[3:10] == ["conformance", "-n", "12", "--dist", "worksteal", "-m",
                            "not multi_gpu and not (traffic or timing)"]  # fmt: skip
    assert alone[3:10] == ["conformance", "-n", "1", "--dist", "loadfile", "-m",
                           "not multi_gpu and (traffic or timing)"]  # fmt: skip
    assert multi[3:10] == ["conformance", "-n", "1", "--dist", "worksteal", "-m", "multi_gpu"]
    assert all("--no-preflight" in cmd for cmd in (shared, alone, multi))  # the front door checked it
    assert shared_env["CONFORMANCE_WORKER_GPUS"] == alone_env["CONFORMANCE_WORKER_GPUS"] == "0,1"
    assert shared_env["OMP_NUM_THREADS"] == "1"  # 16 cores over 12 workers
    assert shared_env["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    # GPU waits asleep where workers share a GPU; CUDA's own where the GPU-alone cases measure
    waits = (shared_env["CONFORMANCE_CUDA_SYNC"], alone_env["CONFORMANCE_CUDA_SYNC"])
    assert waits == ("blocking", "default")
    assert "CONFORMANCE_WORKER_GPUS" not in multi_env  # one unpinned worker sees every GPU
    # held at its gate, the GPU-alone phase waits on one thread for torch's ops, then takes the cores (one
    # worker whatever the GPUs); beside the shared phase, the multi-GPU worker has a shared-phase worker's
    assert (alone_env["OMP_NUM_THREADS"], alone_env["CONFORMANCE_THREADS_AT_GATE"]) == ("1", "16")
    assert (multi_env["OMP_NUM_THREADS"], multi_env["TORCHINDUCTOR_COMPILE_THREADS"]) == ("1", "1")
    assert {e["CONFORMANCE_RUN_ID"] for e in (shared_env, alone_env, multi_env)} == {
        shared_env["CONFORMANCE_RUN_ID"]
    }
    table = _table(console)
    names = [p.name for p in table]
    assert names == ["preflight (overlapped)", "cases (shared GPU)", "prelower (overlapped)",
                     "cases (multi-GPU)", "cases (GPU alone)", "report"]  # fmt: skip
    assert table[1].detail == "12 workers, 6 per GPU; 15 compiling beside; GPU waits asleep"
    assert table[3].detail == "1 worker, all GPUs; beside the shared phase (its cases measure nothing)"
    assert table[3].start_s <= table[1].start_s + 0.5  # its row spans its own run, from the start
    header = "16 cores, 2 CUDA device(s), 125 GiB available: 12 case worker(s) (6 per GPU, 1 thread(s) each)"
    header += " and 15 compile processes; then 'traffic or timing' alone, one worker"
    assert ("log", header) in console.calls
    (why,) = [m for k, m in console.calls if k == "log" and str(m).startswith("sized so: ")]
    assert "16 cores: a budget of 15" in str(why)
    (pages,) = [c for c in console.of("run") if "reports" in c]  # type: ignore[operator]
    assert pages[3:6] == [str(tmp_path / "results" / f"{shard}.json") for shard in ["conformance", *shards]]


def test_the_preflight_runs_beside_the_first_cases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    console = FakeConsole(gpus=1)
    background = FakeBackground(monkeypatch, after=console.running)  # it ends only once the cases run
    run.run_suite(console, _suite(tmp_path))
    assert background.events == ["is-done", "start", "preflight in group -1", "stop"]
    assert all("--no-preflight" in cmd for cmd in console.pytest_args())  # the front door checks
    table = {p.name: p for p in _table(console)}
    preflight, shared = table["preflight (overlapped)"], table["cases (shared GPU)"]
    assert shared.start_s < preflight.start_s + preflight.wall_s  # the cases did not wait for it
    assert preflight.detail == "toolchain OK"


def test_each_step_of_a_gpu_run_says_how_many_tasks_were_runnable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        run,
        "BusySampler",
        lambda **kw: BusySampler(0.005, scan=lambda: [ProcessState(1, 1, 13, "python3")], cores=16, **kw),
    )
    console = FakeConsole(gpus=1)
    FakeBackground(monkeypatch, after=console.running)  # the preflight lasts a few samples
    run.run_suite(console, _suite(tmp_path))
    details = {p.name: p.detail for p in _table(console)}
    # one process (not the sampler's) with 13 runnable threads, one of them taken for the sampler's own
    busy = "busy processes p50 1, p95 1, max 1, mean 1.0 ("  # one busy process all along
    assert details["preflight (overlapped)"].startswith(f"toolchain OK; {busy}")
    assert " process-s) of 16 cores, over them in 0 of " in details["preflight (overlapped)"]
    assert details["preflight (overlapped)"].endswith("samples; runnable tasks p50 12, p95 12, max 12")
    trace = (tmp_path / "results" / "conformance.busy.tsv").read_text().splitlines()  # the run's own timeline
    assert trace[0] == TRACE_HEADER.rstrip("\n")
    assert len(trace) > 2
    assert all(row.split("\t")[1:] == ["12", "1", ""] for row in trace[1:])


def test_a_failed_preflight_stops_the_running_cases_the_prelowering_and_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    console = FakeConsole(gpus=1, codes={"conformance": "WAIT"})
    background = FakeBackground(monkeypatch, preflight=EXIT_PREFLIGHT, after=console.running)
    started = time.monotonic()
    with pytest.raises(SystemExit) as stopped:
        run.run_suite(console, _suite(tmp_path))
    assert time.monotonic() - started < 5  # the running phase was stopped, not waited for
    assert stopped.value.code == EXIT_PREFLIGHT
    assert background.events == ["is-done", "start", "preflight in group -1", "stop"]
    assert len(console.pytest_args()) == 1  # no later phase started
    details = {p.name: p.detail for p in _table(console)}
    assert details["preflight (overlapped)"] == "toolchain check failed (exit 3)"
    assert details["cases (GPU alone)"].startswith("not started: the backend's toolchain preflight failed")
    assert details["prelower (overlapped)"] == "54 lowered"
    reason = "the backend's toolchain preflight failed (its diagnosis is above); the cases were stopped"
    assert console.calls[-1] == ("log", f"conformance run stopped: {reason} (exit 3)")


def test_without_the_front_doors_preflight_each_phase_checks_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    FakeBackground(monkeypatch)
    console = FakeConsole(
        gpus=1, codes={"conformance": EXIT_PREFLIGHT, "conformance-exclusive": EXIT_PREFLIGHT}
    )
    with pytest.raises(Failed, match="pytest exit code 3"):
        run.run_suite(console, _suite(tmp_path, "-k", "mm_out"))  # narrowed: no front-door preflight
    assert [("--no-preflight" in cmd) for cmd in console.pytest_args()] == [False, False]


def test_a_narrowed_selection_and_a_cell_skip_the_prelowering(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    background = FakeBackground(monkeypatch)
    narrowed = FakeConsole(gpus=1)
    run.run_suite(narrowed, _suite(tmp_path, "-k", "mm_out"))
    run.run_suite(FakeConsole(gpus=1), _suite(tmp_path, prelower=False))
    assert background.events == []  # nor asked whether it is done
    # without the pre-lowering: the same case workers, nothing compiling beside
    assert narrowed.pytest_args()[0][4:6] == ["-n", "12"]
    assert _table(narrowed)[0].detail == "12 workers, 12 per GPU; GPU waits asleep"
    # on two GPUs the multi-GPU phase then runs after the shared one, alone: torch's own thread count
    two = FakeConsole(gpus=2)
    run.run_suite(two, _suite(tmp_path, "-k", "mm_out"))
    (multi_env,) = [env for cmd, env in two.of("pytest") if "multi_gpu" in cmd]  # type: ignore[misc]
    assert "OMP_NUM_THREADS" not in multi_env


def test_prelower_off_still_runs_the_preflight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    background = FakeBackground(monkeypatch)
    monkeypatch.setenv("CONFORMANCE_PRELOWER", "0")
    console = FakeConsole(gpus=1)
    run.run_suite(console, _suite(tmp_path))
    assert background.events == ["preflight"]
    assert console.pytest_args()[0][4:6] == ["-n", "12"]


def test_a_warm_cache_starts_no_prelowering(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    background = FakeBackground(monkeypatch, is_done=0)
    console = FakeConsole(gpus=1)
    run.run_suite(console, _suite(tmp_path))
    assert background.events == ["is-done", "preflight"]  # the preflight as ever, no pre-lowering
    assert console.pytest_args()[0][4:6] == ["-n", "15"]  # nothing compiles beside: the whole budget
    assert [p.name for p in _table(console)][:2] == ["preflight (overlapped)", "cases (shared GPU)"]
    assert _table(console)[1].detail == "15 workers, 15 per GPU; GPU waits asleep"
    header = "16 cores, 1 CUDA device(s), 125 GiB available: 15 case worker(s) (15 per GPU, 1 thread(s) each)"
    header += " and no compile process; then 'traffic or timing' alone, one worker"
    assert ("log", header) in console.calls
    (why,) = [m for k, m in console.calls if k == "log" and str(m).startswith("sized so: ")]
    assert str(why).endswith(
        f"; pre-lowering: done by an earlier run (stamp {STAMP}); "
        "case workers: the whole budget, 15 (15 per GPU)"
    )


def test_a_cold_cache_prelowers_beside_the_cases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    background = FakeBackground(monkeypatch, is_done=1)
    console = FakeConsole(gpus=1)
    run.run_suite(console, _suite(tmp_path))
    assert background.events == ["is-done", "start", "preflight in group -1", "stop"]
    assert console.pytest_args()[0][4:6] == ["-n", "12"]
    assert _table(console)[1].detail == "12 workers, 12 per GPU; 15 compiling beside; GPU waits asleep"
    (why,) = [m for k, m in console.calls if k == "log" and str(m).startswith("sized so: ")]
    assert str(why).endswith("pre-lowering beside them at a lower priority: 15 compile processes")


def test_a_signal_mid_phase_writes_the_page_skips_the_rest_and_exits_with_its_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    background = FakeBackground(monkeypatch)
    console = FakeConsole(gpus=2, codes={"conformance": "SIGTERM", "conformance-multi-gpu": "RUNNING"})
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped:
        run.run_suite(console, _suite(tmp_path))
    assert stopped.value.code == EXIT_SIGTERM
    assert len(console.of("pytest")) == 2  # the shared phase and the multi-GPU one beside it
    # the GPU-alone phase, started early, was ended at its gate and left no result file; the multi-GPU
    # phase, still running beside, was stopped and kept what its cases recorded
    assert console.of("signal") == [
        ("conformance-multi-gpu", signal.SIGTERM),
        ("conformance-exclusive", signal.SIGTERM),
    ]
    assert not (tmp_path / "results" / "conformance-exclusive.json").exists()
    assert (tmp_path / "results" / "conformance-multi-gpu.json").exists()
    assert background.events[-1] == "stop"  # before the table: its GPU work ends with the run
    details = {p.name: p.detail for p in _table(console)}
    assert details["cases (GPU alone)"] == "not started: the run was stopped by SIGTERM"
    assert details["cases (multi-GPU)"] == "stopped with the run: the run was stopped by SIGTERM"
    assert console.calls[-1] == ("log", "conformance run stopped: the run was stopped by SIGTERM (exit 143)")
    assert signal.getsignal(signal.SIGTERM) is before  # the front door's handler is gone


def test_the_deadline_is_shared_out_over_the_phases(tmp_path: Path) -> None:
    console = FakeConsole(gpus=0)
    run.run_suite(console, _suite(tmp_path, "--run-deadline", "100", "-x"))
    (check,) = console.of("check_args")
    assert check == ["/venv/bin/python", "-m", "runner.check_args", "conformance", "-x"]
    (cmd,) = console.pytest_args()
    assert cmd[-2] == "-x"
    assert cmd[-1].startswith("--run-deadline=")
    assert 85 <= float(cmd[-1].partition("=")[2]) <= 90  # less the report's reserve (a tenth)


@pytest.mark.parametrize(
    ("posargs", "check_args", "message"),
    [
        (("--run-deadline", "soon"), 0, "--run-deadline: 'soon' is not a number of seconds"),
        (("--dtype=float64",), 4, "nothing was run and results/ is as it was: fix the arguments above"),
    ],
)
def test_bad_arguments_stop_the_run_before_results_move(
    tmp_path: Path, posargs: tuple[str, ...], check_args: int, message: str
) -> None:
    console = FakeConsole(gpus=0, check_args=check_args)
    with pytest.raises(Failed, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        run.run_suite(console, _suite(tmp_path, *posargs))
    assert not console.of("run")  # results/ untouched: no archive, no phase


def test_a_shard_left_with_only_a_journal_is_finished_from_it(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "conformance.json.journal.jsonl").write_text("")

    class Crashing(FakeConsole):
        def exit_code(self, cmd: Sequence[str], **kwargs: object) -> int:
            return self.check_args if "runner.check_args" in cmd else 139

    console = Crashing(gpus=0)
    with pytest.raises(Failed, match="pytest exit code 139"):
        run.run_suite(console, _suite(tmp_path))
    junit = f"--junit={results / 'conformance.junit.xml'}"
    finalize = ["/venv/bin/python", "-m", "harness.finalize", str(results / "conformance.json"), junit]
    at = console.calls.index(("run", finalize))
    assert console.calls[at + 1] == ("success_codes", [0, 1])  # 1: the run it records failed


# ------------------------------------------------------------------------------------------------ the parts


@pytest.mark.parametrize(
    ("stop", "codes", "expected"),
    [
        (None, [0, 0], None),
        (None, [5, 0], None),  # nothing selected in one phase is fine
        (None, [], None),
        (None, [0, 1, 2], report.Verdict("conformance run failed: pytest exit code 1")),
        (None, [5, 5], report.Verdict(
            "conformance run exercised no case of the backend under test (pytest exit code 5 in every "
            "phase): every case it selected was skipped, a coverage gap or one of the suite's self-checks "
            "(see the skip reasons), or -k / -m / the chapter path selected none")),
        (("the run was stopped by SIGINT", 130), [1],
         report.Verdict("conformance run stopped: the run was stopped by SIGINT (exit 130)", 130)),
    ],
)  # fmt: skip
def test_verdict(stop: tuple[str, int] | None, codes: list[int], expected: report.Verdict | None) -> None:
    assert report.verdict(stop, codes) == expected


def test_plan_helpers(tmp_path: Path) -> None:
    assert plan.run_id("cell-x", {"CONFORMANCE_RUN_ID": " ci-1 "}) == "ci-1"
    assert plan.run_id("cell-x", {}, now=0).startswith("19700101T000000Z-")
    assert plan.visible_gpu_ids(2, {"CUDA_VISIBLE_DEVICES": "3, 7,9"}) == ["3", "7"]
    assert plan.visible_gpu_ids(2, {}) == ["0", "1"]
    assert plan.pinning(1, {}) == {}
    assert plan.pinning(2, {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}) == {
        "CONFORMANCE_WORKER_GPUS": "GPU-a,GPU-b"
    }
    args = ("-k", "x", "--backend", "a:B", "--backend-path=/p", "--backend")
    assert plan.backend_args(args) == ["--backend", "a:B", "--backend-path", "/p"]
    suite = SuiteRun(tmp_path, "c", ("conformance",), str(tmp_path / ".nox" / "bin" / "python"))
    assert suite.shown_python == ".nox/bin/python"
    assert not suite.narrowed
    assert all(SuiteRun(tmp_path, "c", (), "p", (arg,)).narrowed for arg in ("-kmm", "-m", "a.py", "a::b"))
    phase = PytestPhase("t", "s", 3, "m", "d", paths=("a.py", "--dtype=x"))
    assert phase.args(["conformance"], skip_preflight=True) == [
        "a.py", "--dtype=x", "-n", "3", "--dist", "worksteal", "-m", "m", "--no-preflight"
    ]  # fmt: skip


def test_the_shared_phase_waits_asleep_unless_the_user_says_otherwise() -> None:
    size = sizing.size_gpu_run(1, cpus=16, memory_gib=125.0)
    env = plan.shared_env({}, size, {})
    assert env["CONFORMANCE_CUDA_SYNC"] == "blocking"
    assert plan.shared_phase("conformance", size, env).detail.endswith("; GPU waits asleep")
    chosen = plan.shared_env({}, size, {"CONFORMANCE_CUDA_SYNC": "default"})
    assert chosen["CONFORMANCE_CUDA_SYNC"] == "default"
    assert "asleep" not in plan.shared_phase("conformance", size, chosen).detail


def test_the_gpu_alone_phase_collects_only_the_modules_that_mark_such_cases() -> None:
    found = plan.modules_marking(ROOT, ["conformance", "--dtype=float32"], plan.EXCLUSIVE_MARKS)
    assert found is not None
    assert "conformance/traffic_meter/test_traffic_meter.py" in found
    assert "conformance/program_format/test_program_format.py" not in found
    assert found[-1] == "--dtype=float32"
    assert plan.modules_marking(ROOT, ["conformance/mm_out/test_mm_out.py"], plan.EXCLUSIVE_MARKS) is None


def test_the_prelowering_summary_and_when_it_does_not_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = ["prelower: 2 programs for cuda+cpu", "  mlp  cuda  float32  1.0s", "  mlp  cpu  float32  0.5s"]
    assert prelowering.summarize(table) == "prelower: stopped after the parallel phase, 2 compiles done"
    assert prelowering.summarize([*table, "prelower: 2 lowered in 1.5 s"]) == "prelower: 2 lowered in 1.5 s"

    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError("started")

    monkeypatch.setattr(prelowering.subprocess, "Popen", no_process)
    console = FakeConsole(gpus=1)
    log = tmp_path / "p.log"
    assert prelowering.start_prelowering(console, "py", 0, log, []) is None  # type: ignore[arg-type]
    suite = _suite(tmp_path)
    assert plan.prelowers(suite, {})
    assert not plan.prelowers(suite, {"CONFORMANCE_PRELOWER": "0"})
    assert not plan.prelowers(_suite(tmp_path, "-k", "mm_out"), {})
    assert not plan.prelowers(_suite(tmp_path, prelower=False), {})


@pytest.mark.skipif(sys.version_info < (3, 11), reason="process_group needs Python 3.11")
def test_the_preflight_runs_in_the_prelowerings_group_while_it_lasts(tmp_path: Path) -> None:
    """The real call, a shell script standing in for the run's interpreter: it exits 0 only in the
    process group it was asked to join (the pre-lowering's, counted as one); once that group has
    ended, the preflight still runs, in the front door's group."""
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\nset -- $(cat /proc/$$/stat)\n[ "$5" = "$WANT" ]\n')
    python.chmod(0o755)
    leader = subprocess.Popen(["sleep", "30"], process_group=0)  # as the pre-lowering: our session
    try:
        env = {"WANT": str(leader.pid)}
        assert prelowering.check_toolchain(str(python), [], env, 10, group=leader.pid) == 0
        assert prelowering.check_toolchain(str(python), [], env, 10) == 1  # not asked: ours
    finally:
        leader.kill()
        leader.wait()
    env = {"WANT": str(os.getpgid(0))}
    assert prelowering.check_toolchain(str(python), [], env, 10, group=leader.pid) == 0  # gone: ours


def test_asking_whether_an_earlier_run_lowered_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real query, a shell script standing in for the run's interpreter: it asks about what the
    pre-lowering would compile (its command, ``--is-done`` for ``--jobs``), and only exit 0 means done."""
    asked = tmp_path / "asked"
    python = tmp_path / "python"
    python.write_text(
        f'#!/bin/sh\necho "$@" > {asked}\nprintf "%s\\n" "$ANSWER"\nsleep "$SLEEP"\nexit "$CODE"\n'
    )
    python.chmod(0o755)
    backend = ["--backend", "my:BACKEND"]
    console = FakeConsole(gpus=1)

    def ask(code: int, answer: str, timeout: float | None = None, sleep: float = 0) -> str | None:
        monkeypatch.setenv("CODE", str(code))
        monkeypatch.setenv("ANSWER", answer)
        monkeypatch.setenv("SLEEP", str(sleep))
        return prelowering.earlier_prelowering(console, str(python), backend, timeout)  # type: ignore[arg-type]

    done = "prelower: done, 74 programs for cuda+cpu (stamp /c/prelower/ab cd.done)"
    assert ask(0, f"a warning\n{done}") == "/c/prelower/ab cd.done"
    started = prelowering.prelower_command(str(python), 8, backend)
    assert asked.read_text().split() == [a if a != "--jobs=8" else "--is-done" for a in started[1:]]
    query = (
        f"{python} -m conformance.suite.prelower --device=cuda --device=cpu --is-done --backend my:BACKEND"
    )
    assert console.calls[-1] == ("log", f"{query}: exit 0, {done}")
    assert ask(0, "prelower: done") == "unnamed"  # done, though it did not say where
    assert ask(1, "prelower: not done, 74 programs for cuda+cpu (no stamp: /c/x.done)") is None
    assert ask(2, "usage: prelower.py [-h] ...") is None  # e.g. an older prelower without --is-done
    assert ask(1, "Traceback (most recent call last): ...") is None  # a crash
    assert ask(0, done, timeout=0.2, sleep=5) is None  # no answer in time
    assert console.calls[-1] == ("log", f"{query}: no answer (TimeoutExpired); pre-lowering as usual")
    assert prelowering.earlier_prelowering(console, str(tmp_path / "none"), [], None) is None  # type: ignore[arg-type]
    assert "no answer (FileNotFoundError)" in str(console.calls[-1][1])


def test_stopping_the_prelowering_ends_its_process_group(tmp_path: Path) -> None:
    log = tmp_path / "p.log"
    log.write_text("  mlp  cuda  float32  1.0s\n")
    process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    console = FakeConsole(gpus=1)
    job = Prelowering(process, log, time.perf_counter())
    assert prelowering.stop_prelowering(console, job) == "stopped after the parallel phase, 1 compiles done"  # type: ignore[arg-type]
    assert process.returncode == -signal.SIGTERM
    assert console.calls == [
        ("log", f"prelower: stopped after the parallel phase, 1 compiles done (table: {log})")
    ]


def test_the_record_gives_the_table_and_whether_the_toolchain_is_known() -> None:
    record = RunRecord(origin=10.0)
    record.phases.append(Phase("cases (shared GPU)", 12.345, "8 workers, 4 per GPU", 1.5))
    assert [parse_phase(f.removeprefix("--phase=")) for f in record.phase_flags()] == [
        Phase("cases (shared GPU)", 12.35, "8 workers, 4 per GPU", 1.5)
    ]
    assert not record.toolchain_known
    record.exit_codes.append(EXIT_PREFLIGHT)
    assert not record.toolchain_known  # the preflight's own exit: the next phase says why too
    record.exit_codes.append(1)
    assert record.toolchain_known
    assert RunRecord(toolchain_code=0).toolchain_known


def test_the_run_imports_neither_nox_torch_pytest_nor_a_backend() -> None:
    """nox imports this package with whatever interpreter runs nox (it may have no torch)."""
    blocked = ["nox", "torch", "pytest", "conformance", "reference_impl", "upstream_executorch", "reports"]
    code = (
        f"import sys\nfor name in {blocked!r}: sys.modules[name] = None\n"
        "import runner.run, runner.report, runner.sizing\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# ------------------------------------------------------------------------------------------- the fork server


class _Forks:
    """The front door's fork server, without its process: when it starts, and each stop and what it kept."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.stops: list[str | None] = []
        self.server = ForkServer(process=None, folder=Path("/tmp/conformance-fork-x"))  # type: ignore[arg-type]
        monkeypatch.setattr(run, "driver_lists_gpus", lambda: True)
        monkeypatch.setattr(run, "start_server", lambda console, python: self.server)
        monkeypatch.setattr(run, "stop_server", self._stop)

    def _stop(self, server: ForkServer, keep_as: Path | None) -> None:
        assert server is self.server
        self.stops.append(None if keep_as is None else keep_as.name)


def test_a_warm_run_forks_the_shared_phases_workers_from_the_front_doors_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    FakeBackground(monkeypatch, is_done=0)
    forks = _Forks(monkeypatch)
    console = FakeConsole(gpus=1)
    run.run_suite(console, _suite(tmp_path))
    (shared, env), alone = console.of("pytest")[0], console.pytest_args()[1]  # type: ignore[misc]
    assert "harness.forkserver" in shared
    assert env[forkserver.SOCKET_ENV] == "/tmp/conformance-fork-x/socket"
    assert "harness.forkserver" not in alone  # one worker, held at its gate: nothing to gain
    # stopped after the shared phase, its output kept beside the shard; then, at the run's end, nothing
    assert forks.stops == ["conformance.forkserver.log", None]


def test_a_cold_run_starts_its_workers_cold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    FakeBackground(monkeypatch, is_done=1)
    forks = _Forks(monkeypatch)
    console = FakeConsole(gpus=1)
    run.run_suite(console, _suite(tmp_path))
    (shared, env) = console.of("pytest")[0]  # type: ignore[misc]
    assert "harness.forkserver" not in shared
    assert forkserver.SOCKET_ENV not in env
    assert forks.stops[0] is None  # stopped before the phase, its output dropped


def test_a_failed_check_stops_the_server_and_keeps_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    forks = _Forks(monkeypatch)
    with pytest.raises(Failed):
        run.run_suite(FakeConsole(gpus=1, check_args=4), _suite(tmp_path))
    assert forks.stops == [None]
