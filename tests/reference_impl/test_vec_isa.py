"""The once-per-machine vector-ISA verdict (``reference_impl/lowering/vec_isa.py``): inductor picks the same
ISAs with it as with its own per-process probe, a recorded verdict is reused without probing, and a failed
probe leaves inductor probing as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reference_impl.lowering import vec_isa

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(vec_isa._candidates() is None, reason="the verdict exists for x86-64 Linux")

_CHILD = """
import json
from torch._inductor import config
from torch._inductor.cpu_vec_isa import valid_vec_isa_list
from reference_impl.lowering.vec_isa import probed_once
with probed_once():
    print(json.dumps([config.cpp.vec_isa_ok, [str(i) for i in valid_vec_isa_list()]]))
"""


@pytest.mark.proof
def test_the_verdict_gives_inductor_the_isas_its_own_probe_gives(tmp_path: Path) -> None:
    """Torch's own probe (this process) and a fresh process reading the recorded verdict give inductor the
    same ISA list; the verdict is claimed exactly when every advertised ISA passed."""
    from torch._inductor import config
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    with config.patch({"cpp.vec_isa_ok": None}):
        probed = [str(i) for i in valid_vec_isa_list()]
    claimed = vec_isa.all_advertised_isas_pass(tmp_path)
    assert claimed is (probed == [str(i) for i in vec_isa._candidates() or []])
    env = {**os.environ, "CONFORMANCE_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}  # fmt: skip
    env.pop("TORCHINDUCTOR_VEC_ISA_OK", None)
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True,
                         check=True, cwd=ROOT, timeout=300).stdout  # fmt: skip
    ok, isas = json.loads(out.strip().splitlines()[-1])
    assert isas == probed
    assert ok is (True if claimed else None)


def test_a_recorded_verdict_is_reused_without_probing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    monkeypatch.setattr(vec_isa, "_probe", lambda c: calls.append(1) or [str(i) for i in c])
    assert vec_isa.all_advertised_isas_pass(tmp_path) is True
    assert vec_isa.all_advertised_isas_pass(tmp_path) is True
    assert calls == [1]


def test_a_failed_isa_leaves_inductor_probing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One advertised ISA failing its probe (a compiler without AVX-512, say): no verdict is claimed, so
    inductor keeps probing every process and drops that ISA itself."""
    from torch._inductor import config

    monkeypatch.setattr(vec_isa, "_probe", lambda c: [str(i) for i in c][1:])
    monkeypatch.setattr(vec_isa, "default_cache_dir", lambda: tmp_path)
    assert vec_isa.all_advertised_isas_pass() is False
    verdict = json.loads(next((tmp_path / "toolchain").glob("vec-isa-*.json")).read_text())
    assert verdict["passed"] == verdict["candidates"][1:]
    with vec_isa.probed_once():
        assert config.cpp.vec_isa_ok is None
