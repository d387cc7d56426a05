"""The PyTorch AOTInductor adapter (``torch_aoti:BACKEND`` and ``torch_aoti:CHECKED``) on the CPU.

One tiny two-method program is lowered once for the module (two AOTInductor compiles); the check modes run
in subprocesses, because each compiled model reads ``AOTI_RUNTIME_CHECK_INPUTS`` once per process.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from conformance.protocol import lower_options, lowering_devices, missing_attributes
from conformance.suite import known_failures
from harness.backend_loader import load_backend
from torch_aoti import backend as adapter

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "torch_aoti"
REPROS = sorted(p for p in (PACKAGE / "repros").glob("*.py") if not p.name.startswith("_"))  # _: shared
KNOWN_FAILURE_FILES = sorted(PACKAGE.glob("known_failures*.toml"))
SHAPE = (4, 8)


class Double(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class Add(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


def _env() -> dict[str, str]:
    """This environment without the check variable, with the checkout importable."""
    env = {k: v for k, v in os.environ.items() if k != adapter.CHECK_ENV}
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))}


@pytest.fixture(scope="module", autouse=True)
def _own_inductor_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Each xdist worker compiles this module's models into an inductor cache of its own: two workers
    compiling the same kernel into one shared cache can package a half-rewritten file (a two-method
    package that failed to load was seen once under `pytest tests -n 2`, never alone)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))
        yield


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``double`` and ``add`` lowered for the CPU into one package, as a file for the subprocesses."""
    backend = adapter.TorchAotiBackend(checked=False)
    # Distinct example tensors: one tensor passed twice is exported as one input read twice.
    ones, twos = torch.ones(SHAPE), torch.full(SHAPE, 2.0)
    data = backend.lower({"double": (Double(), (ones,)), "add": (Add(), (ones, twos))}, device="cpu")
    path = tmp_path_factory.mktemp("torch-aoti") / "two-methods.pt2"
    path.write_bytes(data)
    return path


def test_identity_and_parts() -> None:
    backend = adapter.TorchAotiBackend(checked=False)
    assert backend.name == "torch-aoti"
    assert torch.__version__ in backend.version
    assert "unset" in backend.version
    checked = adapter.TorchAotiBackend(checked=True)
    assert checked.name == "torch-aoti-checked"
    assert f"{adapter.CHECK_ENV}=1" in checked.version
    for part in ("lowering", "runtime"):
        assert missing_attributes(backend, part) == []
    # Absent on purpose (backend.py's docstring): no *_copy ops, no options, placement fixed by nature.
    for part in ("view_pass", "runtime_options", "device_placement", "mm_out"):
        assert missing_attributes(backend, part) != []
    assert lowering_devices(backend) == ("cpu", "cuda")
    assert lower_options(backend) == frozenset()


@pytest.mark.parametrize(
    ("value", "on"), [(None, False), ("0", False), ("1", True), ("", True), ("yes", True)]
)
def test_check_mode_is_read_as_the_generated_code_reads_it(value: str | None, on: bool) -> None:
    # The C++ is `value != nullptr && value[0] != '0'`: an empty value turns the checks on.
    env = {} if value is None else {adapter.CHECK_ENV: value}
    assert adapter.checks_on(env) is on


def test_options_and_bad_names_are_refused_before_compiling() -> None:
    backend = adapter.TorchAotiBackend(checked=False)
    ones = torch.ones(SHAPE)
    with pytest.raises(ValueError, match="skip_h2d_for_method_inputs"):
        backend.lower({"m": (Double(), (ones,))}, device="cpu", options={"skip_h2d_for_method_inputs": True})
    with pytest.raises(ValueError, match="method name"):
        backend.lower({"": (Double(), (ones,))}, device="cpu")
    with pytest.raises(ValueError, match="device"):
        backend.lower({"m": (Double(), (ones,))}, device="mps")


def test_importing_the_package_imports_no_torch_and_sets_nothing() -> None:
    code = (
        "import os, sys, torch_aoti; print(sorted({'torch'} & set(sys.modules)), os.environ.get(sys.argv[1]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, adapter.CHECK_ENV],
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[] None"


@pytest.mark.proof
def test_two_methods_in_one_package_run_by_name(program: Path) -> None:
    backend = adapter.TorchAotiBackend(checked=False)
    data = program.read_bytes()
    x, y = torch.arange(32.0).reshape(SHAPE), torch.full(SHAPE, 3.0)
    double, add = backend.init(data, "double"), backend.init(data, "add")
    assert torch.equal(backend.execute(double, [x])[0], x * 2)
    assert torch.equal(backend.execute(add, [x, y])[0], x + y)
    assert backend.execute_stats(add) == {"h2d_bytes": 0, "d2h_bytes": 0}
    out = [torch.zeros(SHAPE)]
    assert backend.execute(add, [x, y], out)[0] is out[0]
    assert torch.equal(out[0], x + y)
    backend.destroy(add)
    with pytest.raises(ValueError, match="destroyed"):
        backend.execute(add, [x, y])
    with pytest.raises(ValueError, match=r"(?s)^method: .*Available models"):
        backend.init(data, "nope")
    with pytest.raises(ValueError, match=r"(?s)^program: .*central directory"):
        backend.init(data[: len(data) // 2], "add")


CHILD = """
import json, sys, torch
from harness.backend_loader import load_backend
backend = load_backend(sys.argv[1])
handle = backend.init(open(sys.argv[2], "rb").read(), "add")
x = torch.ones({shape})
try:
    out = backend.execute(handle, [x, x.double()])
    result = {{"outcome": "accepted", "dtype": str(out[0].dtype)}}
except ValueError as exc:
    result = {{"outcome": "rejected", "message": str(exc)}}
print(json.dumps({{"name": backend.name, **result}}))
"""


@pytest.mark.parametrize(
    ("spec", "outcome"), [("torch_aoti:BACKEND", "accepted"), ("torch_aoti:CHECKED", "rejected")]
)
@pytest.mark.proof
def test_default_mode_accepts_float64_and_checked_rejects_it(program: Path, spec: str, outcome: str) -> None:
    code = CHILD.format(shape=SHAPE)
    done = subprocess.run(
        [sys.executable, "-c", code, spec, str(program)], env=_env(), capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["outcome"] == outcome, result
    if outcome == "accepted":
        assert result == {"name": "torch-aoti", "outcome": "accepted", "dtype": "torch.float32"}
    else:
        assert result["name"] == "torch-aoti-checked"
        assert result["message"].startswith("inputs: ")
        assert "unmatched dtype" in result["message"]


@pytest.mark.proof
def test_checked_refuses_to_load_after_an_unchecked_run(program: Path) -> None:
    code = (
        "import sys, torch, torch_aoti\n"
        "b = torch_aoti.BACKEND\n"
        "b.execute(b.init(open(sys.argv[1], 'rb').read(), 'double'), [torch.ones(4, 8)])\n"
        "try:\n    torch_aoti.CHECKED\nexcept RuntimeError as exc:\n    print('refused:', exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(program)], env=_env(), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused:" in done.stdout
    assert "process of its own" in done.stdout


def test_backends_load_through_the_suites_loader() -> None:
    code = "from harness.backend_loader import load_backend; print(load_backend('torch_aoti:CHECKED').name)"
    done = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, cwd=ROOT)
    assert done.stdout.strip() == "torch-aoti-checked", done.stderr[-2000:]
    assert load_backend("torch_aoti:BACKEND").name in ("torch-aoti", "torch-aoti-checked")


@pytest.mark.parametrize("path", KNOWN_FAILURE_FILES, ids=lambda p: p.name)
def test_known_failures_parse_and_say_why(path: Path) -> None:
    entries = known_failures.load_file(path)
    assert entries
    for entry in entries:
        assert entry.reason.strip(), entry.describe()
        assert entry.link.startswith("https://") or entry.link.startswith("none found"), entry.describe()


def test_every_known_failure_names_a_repro_that_exists() -> None:
    for path in KNOWN_FAILURE_FILES:
        for entry in known_failures.load_file(path):
            named = [r.name for r in REPROS if f"repros/{r.name}" in entry.reason]
            assert named, f"{entry.describe()}: its reason names no script of torch_aoti/repros/"


@pytest.mark.proof
@pytest.mark.parametrize("script", REPROS, ids=lambda p: p.stem)
def test_repro_runs_and_reproduces(script: Path, tmp_path: Path) -> None:
    # A compile cache of its own: several repros compile the same model, and two compiles of one model at
    # once (xdist workers) left a package with an empty metadata file in a shared inductor cache.
    env = {**_env(), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    if done.stdout.startswith("skipped: "):  # a repro of the CUDA target, on a machine without one
        pytest.skip(f"{script.name}: {done.stdout.splitlines()[0]}")
    assert "reproduced" in done.stdout


def test_staging_keeps_sizes_and_strides() -> None:
    """What the runner of a CUDA model is given is the caller's layout (shown on the CPU, any device does)."""
    base = torch.arange(64.0).reshape(8, 8)
    for view in (base, base.t(), base[::2, 1::3], base[2:, :4]):
        placed = adapter.same_layout_on(view, "cpu")
        assert (placed.size(), placed.stride()) == (view.size(), view.stride())
        assert torch.equal(placed, view)
        assert placed.data_ptr() != view.data_ptr()  # a copy
    expanded = torch.arange(4.0).expand(3, 4)  # elements share memory: copied densely
    assert torch.equal(adapter.same_layout_on(expanded, "cpu"), expanded)


@pytest.mark.proof
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: the CUDA target's staging")
def test_a_cuda_model_takes_host_inputs_and_returns_host_outputs_and_counts_the_copies() -> None:
    """The protocol's default placement on a CUDA target, which PyTorch's runner does not do itself
    (repros/host_input_cuda_model.py): the adapter copies host inputs in and outputs out, and says so."""
    backend = adapter.TorchAotiBackend(checked=False)
    ones = torch.ones(SHAPE)
    data = backend.lower({"add": (Add(), (ones, ones))}, device="cuda")
    handle = backend.init(data, "add")
    x, y = torch.arange(32.0).reshape(SHAPE), torch.full(SHAPE, 3.0)
    (out,) = backend.execute(handle, [x, y])
    assert out.device.type == "cpu"
    assert torch.equal(out, x + y)
    assert backend.execute_stats(handle) == {"h2d_bytes": 2 * x.nbytes, "d2h_bytes": out.nbytes}
    (kept,) = backend.execute(handle, [x.cuda(), y.cuda()])  # device tensors go to the runner as given
    assert torch.equal(kept, x + y)
    assert backend.execute_stats(handle)["h2d_bytes"] == 0


def _zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def test_a_package_with_damaged_files_is_compiled_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Two processes compiling one kernel into a shared inductor cache can package an empty metadata file or
    library: lower() compiles again, and says why after PACKAGE_ATTEMPTS damaged packages."""
    meta, lib = "program/data/aotinductor/double/x_metadata.json", "program/data/aotinductor/double/x.so"
    good = _zip({meta: b"{}", lib: b"\x7fELF\x02\x01", "program/x.cpp": b""})
    assert adapter.damaged_members(good) == []
    assert adapter.damaged_members(_zip({meta: b"", lib: b"\x7fELF"})) == [meta]
    assert adapter.damaged_members(_zip({meta: b"{}", lib: b""})) == [lib]
    bad = _zip({meta: b"", lib: b"\x7fELF"})
    made = iter([bad, good])
    monkeypatch.setenv("CONFORMANCE_CACHE_DIR", str(tmp_path))  # a package cache of its own, empty
    monkeypatch.setattr(adapter, "compile_method", lambda name, exported: [])
    monkeypatch.setattr(adapter, "package_methods", lambda compiled: next(made))
    backend = adapter.TorchAotiBackend(checked=False)
    methods = {"double": (Double(), (torch.ones(SHAPE),))}
    assert backend.lower(methods, device="cpu") == good
    monkeypatch.setattr(adapter, "package_methods", lambda compiled: bad)
    monkeypatch.setenv("CONFORMANCE_CACHE_DIR", str(tmp_path / "another"))  # else the good one is cached
    with pytest.raises(RuntimeError, match=r"damaged files 3 times .*x_metadata\.json.*inductor cache"):
        backend.lower(methods, device="cpu")
    assert not list((tmp_path / "another" / "torch_aoti").glob("*.pt2"))  # nothing damaged is kept


@pytest.mark.proof  # the real compile of ``program`` (31 s on a cold cache), which only proofs share
def test_a_real_package_has_no_damaged_member(program: Path) -> None:
    assert adapter.damaged_members(program.read_bytes()) == []
