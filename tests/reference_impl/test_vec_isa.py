"""Torch's vector-ISA build checks, once per machine (``reference_impl/lowering/vec_isa.py``): inductor
picks the same ISAs with the recorded answers as with its own checks, a recorded answer (yes or no) is
reused without checking again, concurrent first askers run one check, and the patch is undone on exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from reference_impl.lowering import vec_isa

ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import json, sys
from torch._inductor import cpu_vec_isa
from reference_impl.lowering import vec_isa
if sys.argv[1] == "speculate":  # only the side-by-side checks of the plan: inductor asks nothing here
    plan = vec_isa._plan()
    vec_isa._speculate(plan)
    print(json.dumps([len(plan)]))
    sys.exit(0)
if sys.argv[1] == "torch":  # inductor's own checks, nothing shared
    isas, picked = cpu_vec_isa.valid_vec_isa_list(), cpu_vec_isa.pick_vec_isa()
else:  # every answer must come from the record, also in the background warm-up
    def refuse(self, code):
        raise AssertionError(f"torch's check ran for {self}")
    cpu_vec_isa.VecISA.check_build = refuse
    vec_isa.warm_in_background().join()
    with vec_isa.probed_once():
        isas, picked = cpu_vec_isa.valid_vec_isa_list(), cpu_vec_isa.pick_vec_isa()
print(json.dumps([[str(i) for i in isas], str(picked)]))
"""


@pytest.mark.proof
@pytest.mark.skipif(sys.platform != "linux", reason="inductor's vector-ISA checks are Linux/x86 and aarch64")
def test_recorded_answers_give_inductor_what_its_own_checks_give(tmp_path: Path) -> None:
    """Three fresh interpreters: torch's own checks; one that only runs the plan's checks side by side
    (what the preflight's warm-up does before inductor asks); a third in which torch's check raises, so
    every answer inductor asks for must come from what the second recorded. The first and the third give
    inductor the same ISA list and the same pick."""
    env = {**os.environ, "CONFORMANCE_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}  # fmt: skip
    env.pop("TORCHINDUCTOR_VEC_ISA_OK", None)

    def child(mode: str) -> list[object]:
        done = subprocess.run([sys.executable, "-c", _CHILD, mode], env=env, capture_output=True,
                              text=True, cwd=ROOT, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    own = child("torch")
    (planned,) = child("speculate")
    assert 0 < len(list((tmp_path / "toolchain").glob("vec-isa-*.json"))) <= planned
    assert child("forbid") == own


class _Isa:
    """Stands in for a torch ``VecISA``: its name and its compile flags, which AMX changes for one check."""

    def __init__(self, name: str, flags: str) -> None:
        self.name, self._arch_flags = name, flags

    def __str__(self) -> str:
        return self.name


def test_an_answer_is_checked_once_and_reused_yes_or_no(tmp_path: Path) -> None:
    calls: list[str] = []

    def check(answer: bool) -> bool:
        calls.append("checked")
        return answer

    avx2, amx = _Isa("avx2", "-mavx2"), _Isa("amx_tile", "-mamx-tile")
    assert vec_isa.shared_check(avx2, "code", lambda: check(True), tmp_path) is True
    assert vec_isa.shared_check(amx, "code", lambda: check(False), tmp_path) is False
    assert vec_isa.shared_check(avx2, "code", lambda: check(False), tmp_path) is True
    assert vec_isa.shared_check(amx, "code", lambda: check(True), tmp_path) is False
    assert calls == ["checked", "checked"]


def test_the_answer_depends_on_the_isa_its_flags_and_the_code(tmp_path: Path) -> None:
    amx = _Isa("amx_tile", "-mamx-tile")
    paths = {vec_isa.record_path(amx, "amx code", tmp_path), vec_isa.record_path(amx, "other code", tmp_path)}
    amx._arch_flags += " -mamx-fp16"  # what torch does for its AMX-FP16 check
    paths.add(vec_isa.record_path(amx, "amx code", tmp_path))
    paths.add(vec_isa.record_path(_Isa("avx512", "-mamx-tile"), "amx code", tmp_path))
    assert len(paths) == 4


def test_concurrent_first_askers_run_one_check(tmp_path: Path) -> None:
    calls: list[int] = []

    def slow_check() -> bool:
        calls.append(1)
        time.sleep(0.3)
        return True

    isa = _Isa("avx512", "-mavx512f")
    answers: list[bool] = []
    threads = [
        threading.Thread(target=lambda: answers.append(vec_isa.shared_check(isa, "c", slow_check, tmp_path)))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [True] * 4
    assert calls == [1]


def test_probed_once_patches_torchs_check_and_restores_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside (nested too): torch's check runs once per answer, through the record; outside, torch's own
    method is back. With ``cpp.vec_isa_ok`` set, inductor asks no check and nothing is patched."""
    from torch._inductor import config
    from torch._inductor.cpu_vec_isa import VecISA

    monkeypatch.setattr(vec_isa, "default_cache_dir", lambda: tmp_path)
    calls: list[str] = []
    monkeypatch.setattr(VecISA, "check_build", lambda self, code: calls.append(str(self)) or True)
    torch_check = VecISA.__dict__["check_build"]
    isa = _Isa("avx2", "-mavx2")
    with vec_isa.probed_once():
        assert VecISA.__dict__["check_build"] is not torch_check
        with vec_isa.probed_once():
            assert VecISA.check_build(isa, "code") is True
        assert VecISA.check_build(isa, "code") is True
    assert VecISA.__dict__["check_build"] is torch_check
    assert len(calls) == 1
    with config.patch({"cpp.vec_isa_ok": True}), vec_isa.probed_once():
        assert VecISA.__dict__["check_build"] is torch_check


class _Machine:
    """A machine's runnable count and a clock that the room's sleeps move on."""

    def __init__(self, counts: list[int | None]) -> None:
        self.counts, self.now, self.slept = counts, 0.0, 0.0

    def count(self) -> int | None:
        return self.counts.pop(0) if len(self.counts) > 1 else self.counts[0]

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds


def _room(machine: _Machine, limit: int = 14) -> vec_isa.CoreRoom:
    return vec_isa.CoreRoom(limit, machine.count, lambda: machine.now, machine.sleep, wait_s=5.0)


def test_a_check_starts_at_once_where_a_core_is_free() -> None:
    machine = _Machine([13])
    room = _room(machine)
    with room.core():
        assert room.running == 1
        assert machine.slept == vec_isa.ROOM_SETTLE_S  # only the wait for its compiler to show
    assert room.running == 0


def test_a_check_waits_while_the_machine_is_full_and_starts_when_a_core_frees() -> None:
    machine = _Machine([16, 15, 14, 14, 13])
    room = _room(machine)
    with room.core():
        assert machine.now == pytest.approx(4 * vec_isa.ROOM_POLL_S + vec_isa.ROOM_SETTLE_S)


def test_a_full_machine_holds_a_check_while_a_sibling_runs_but_not_the_chain_alone() -> None:
    """While another check runs, a full machine holds the next; the first of them starts after
    ``wait_s`` even on a machine that stays full, so the chain goes on."""
    machine = _Machine([20])
    room = _room(machine)
    with room.core():  # alone: waits its 5 s, then starts
        assert 5.0 <= machine.now < 5.0 + vec_isa.ROOM_POLL_S + vec_isa.ROOM_SETTLE_S + 1e-9
        entered = threading.Event()

        def sibling() -> None:
            with room.core():
                entered.set()

        thread = threading.Thread(target=sibling, daemon=True)
        thread.start()
        assert not entered.wait(0.2)  # the clock runs on (the fake sleeps), the machine stays full
        assert machine.now > 100.0
        machine.counts = [3]  # a core frees
        assert entered.wait(5.0)
        thread.join(5.0)


def test_an_unreadable_count_lets_every_check_start_at_once() -> None:
    machine = _Machine([None])
    room = _room(machine)
    with room.core(), room.core():
        assert room.running == 2
    assert machine.slept == 0.0


def test_the_room_of_this_machine_keeps_a_core_in_eight_for_bursts() -> None:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    assert vec_isa.CoreRoom().limit == max(1, cores - max(1, cores // 8))
    assert vec_isa.runnable_now(Path("/nonexistent/loadavg")) is None


def test_the_runnable_count_is_the_kernels_less_the_reader(tmp_path: Path) -> None:
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("0.52 0.31 0.20 7/1234 9999\n")
    assert vec_isa.runnable_now(loadavg) == 6
    loadavg.write_text("garbled\n")
    assert vec_isa.runnable_now(loadavg) is None
