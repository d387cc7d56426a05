"""The source key: a lowering's cache key taken before export must change with everything export reads,
stay the same across processes for the same source, and refuse (None) what it cannot fingerprint."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.export import Dim

from conformance.models import get_model
from reference_impl.artifact_cache import make_key
from reference_impl.lowering import source_key
from reference_impl.lowering.source_key import package_identity, source_fingerprint

ROOT = Path(__file__).resolve().parents[2]


def _key(module: nn.Module, inputs: tuple, dynamic_shapes: object = None) -> str | None:
    found = source_fingerprint(
        module, inputs, dynamic_shapes=dynamic_shapes, extra_packages=("reference_impl",)
    )
    return None if found is None else make_key(found)


@pytest.fixture
def asr_decoder() -> tuple[nn.Module, tuple]:
    return get_model("asr").build(torch.float32, "cpu")["decoder"]


@pytest.mark.proof
def test_the_same_source_gives_the_same_key_twice_and_across_processes(asr_decoder) -> None:
    module, inputs = asr_decoder
    again = get_model("asr").build(torch.float32, "cpu")["decoder"]
    assert _key(module, inputs) is not None
    assert _key(module, inputs) == _key(*again)
    script = textwrap.dedent(
        """
        import torch
        from conformance.models import get_model
        from reference_impl.artifact_cache import make_key
        from reference_impl.lowering.source_key import source_fingerprint
        module, inputs = get_model("asr").build(torch.float32, "cpu")["decoder"]
        print(make_key(source_fingerprint(module, inputs, extra_packages=("reference_impl",))))
        """
    )
    other = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()[-1]
    assert other == _key(module, inputs)


def test_a_weight_one_ulp_away_changes_the_key(asr_decoder) -> None:
    module, inputs = asr_decoder
    before = _key(module, inputs)
    param = next(module.parameters())
    with torch.no_grad():
        flat = param.view(-1)
        flat[0] = torch.nextafter(flat[0], flat[0] + 1)
    assert _key(module, inputs) != before


def test_inputs_attributes_and_dims_change_the_key(asr_decoder) -> None:
    module, inputs = asr_decoder
    before = _key(module, inputs)
    changed = tuple(t.clone() for t in inputs)
    changed[0].view(-1)[0] += 1
    assert _key(module, changed) != before
    module.extra_scale = 2.0  # a plain attribute forward could read
    assert _key(module, inputs) != before
    assert _key(module, inputs, {"x": {1: Dim("s", min=2, max=32)}}) != _key(
        module, inputs, {"x": {1: Dim("s", min=3, max=32)}}
    )  # Dim's repr leaves out min: the key must not


def test_inductor_variables_count_but_pool_size_and_cache_places_do_not(asr_decoder, monkeypatch) -> None:
    module, inputs = asr_decoder
    before = _key(module, inputs)
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")  # the suite's phases differ in this
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")
    assert _key(module, inputs) == before
    monkeypatch.setenv("TORCHINDUCTOR_MAX_AUTOTUNE", "1")
    assert _key(module, inputs) != before


def test_triton_tool_paths_torch_sets_itself_do_not_count(asr_decoder, monkeypatch) -> None:
    """torch sets these on a process's first Triton compile: counting them made a warm run's workers, which
    compile nothing, miss every memo that a cold run's compiling workers had stored."""
    module, inputs = asr_decoder
    before = _key(module, inputs)
    monkeypatch.setenv("TRITON_PTXAS_PATH", "/somewhere/torch/bin/ptxas")
    monkeypatch.setenv("TRITON_LIBDEVICE_PATH", "/usr/local/cuda/nvvm/libdevice/libdevice.10.bc")
    assert _key(module, inputs) == before
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")  # a Triton choice, not a place
    assert _key(module, inputs) != before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a Triton compile needs a CUDA device")
def test_a_triton_compile_in_the_process_leaves_the_key_as_it_was() -> None:
    """The hazard itself, on the GPU, in a fresh process: whatever torch's first Triton compile changes in
    the process (its environment included) must not change the key of a source it did not touch."""
    script = textwrap.dedent(
        """
        import torch
        from conformance.models import get_model
        from reference_impl.artifact_cache import make_key
        from reference_impl.lowering.source_key import source_fingerprint
        module, inputs = get_model("asr").build(torch.float32, "cpu")["decoder"]
        def key():
            return make_key(source_fingerprint(module, inputs, extra_packages=("reference_impl",)))
        before = key()
        torch.compile(lambda x: torch.sin(x) * 2 + 1)(torch.randn(64, device="cuda"))
        torch.cuda.synchronize()
        print(before, key())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    before, after = done.stdout.split()[-2:]
    assert after == before


def test_tied_weights_are_aliases_not_copies() -> None:
    tied, untied = (
        nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)),
        nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)),
    )
    untied.load_state_dict(tied.state_dict())
    tied[1].weight = tied[0].weight
    with torch.no_grad():
        untied[1].weight.copy_(tied[0].weight)
    inputs = (torch.randn(2, 4),)
    assert _key(tied, inputs) != _key(untied, inputs)


class _Opaque:
    pass


def test_what_has_no_sound_fingerprint_gives_no_key() -> None:
    hooked = nn.Linear(4, 4)
    hooked.register_forward_hook(lambda *args: None)
    assert _key(hooked, (torch.randn(2, 4),)) is None
    opaque = nn.Linear(4, 4)
    opaque.helper = _Opaque()
    assert _key(opaque, (torch.randn(2, 4),)) is None
    assert _key(nn.Linear(4, 4), (_Opaque(),)) is None


def test_a_source_tree_package_is_identified_by_its_files(tmp_path, monkeypatch) -> None:
    package = tmp_path / "keyprobe_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("SCALE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    importlib.import_module("keyprobe_pkg")
    first = package_identity("keyprobe_pkg")
    assert first is not None
    assert first.startswith("sha256:")
    source_key._tree_digest.cache_clear()
    (package / "__init__.py").write_text("SCALE = 2\n")
    assert package_identity("keyprobe_pkg") != first
    assert package_identity("torch") is None  # the toolchain fingerprint has torch's version
    assert package_identity("json") is None  # the standard library: the Python version
    installed = package_identity("pytest")
    assert installed is not None
    assert installed.startswith("pytest==")
    monkeypatch.delitem(sys.modules, "keyprobe_pkg")


@pytest.mark.proof
def test_every_zoo_model_has_a_key() -> None:
    """The memo only helps where keys exist: every zoo model's methods must have one (the Hugging Face ones
    too when transformers is installed), and the fingerprint must be JSON."""
    from conformance.models.zoo import HF_MODELS, HF_UNAVAILABLE, ZOO

    for name, entry in ZOO.items():
        if name in HF_MODELS and HF_UNAVAILABLE is not None:
            continue
        for method, (module, inputs) in entry.build(torch.float32, "cpu").items():
            found = source_fingerprint(module, inputs, dynamic_shapes=entry.dynamic_shapes_for(method))
            assert found is not None, f"{name}.{method}: no source key"
            json.dumps(found)


@pytest.mark.parametrize(
    "top", ["transformers", "numpy", "hypothesis", "sympy", "jinja2", "typing_extensions"]
)
def test_an_installed_package_is_named_as_mapping_every_distribution_names_it(top: str) -> None:
    """The shortcut (a regular package read from its own distribution's record) names what mapping every
    installed distribution names; a module that is no package takes the mapping."""
    import importlib
    import importlib.metadata

    importlib.import_module(top)
    dists = sorted(set(importlib.metadata.packages_distributions()[top]))
    assert package_identity(top) == ",".join(f"{d}=={importlib.metadata.version(d)}" for d in dists)


def test_a_record_is_read_as_its_text_and_an_eggs_files_as_listed(tmp_path: Path) -> None:
    """``_records`` reads a wheel's ``RECORD`` (a CSV: a path may be quoted) without a path object or a disk
    lookup per file; metadata without one (an egg's ``installed-files.txt``) is read through ``files``."""
    import importlib.metadata

    wheel = tmp_path / "probe-1.0.dist-info"
    wheel.mkdir()
    (wheel / "METADATA").write_text("Name: probe\nVersion: 1.0\n")
    (wheel / "RECORD").write_text(
        'probe/__init__.py,sha256=x,1\n"probe/a,b.py",sha256=y,2\nprobe-1.0.dist-info/RECORD,,\n'
    )
    found = importlib.metadata.PathDistribution(wheel)
    assert source_key._records(found, "probe/__init__.py")
    assert source_key._records(found, "probe/a,b.py")
    assert not source_key._records(found, "other/__init__.py")
    egg = tmp_path / "probe.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Name: probe\nVersion: 1.0\n")
    (egg / "installed-files.txt").write_text("../probe/__init__.py\n")
    assert not source_key._records(importlib.metadata.PathDistribution(egg), "other/__init__.py")
