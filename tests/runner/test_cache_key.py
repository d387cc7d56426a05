"""The CI cache key of the artifact directory (``python -m runner.cache_key``): stable for the same backend,
zoo, torch and compiler wherever and whenever they were checked out, different when one of them changes,
and computed without importing torch, the backend or the suite."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from runner import cache_key

ROOT = Path(__file__).resolve().parents[2]


def test_the_key_is_stable_and_imports_neither_torch_nor_the_backend() -> None:
    code = (
        "import sys\n"
        "from runner.cache_key import main\n"
        "main([])\n"
        "loaded = {'torch', 'reference_impl', 'conformance'} & {m.split('.')[0] for m in sys.modules}\n"
        "assert not loaded, loaded\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    keys = [
        subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(2)
    ]
    assert keys[0] == keys[1]
    assert len(keys[0]) == 24
    assert int(keys[0], 16) >= 0


def _package(where: Path, text: str = "BACKEND = object()\n") -> Path:
    (where / "mybackend").mkdir(parents=True)
    (where / "mybackend" / "__init__.py").write_text(text)
    (where / "mybackend" / "kernel.cpp").write_text("int f() { return 1; }\n")
    return where


def _zoo(where: Path) -> Path:
    (where / "models").mkdir(parents=True)
    (where / "models" / "simple.py").write_text("MODEL = 1\n")
    return where / "models"


def _fake_compiler(where: Path, version: str) -> str:
    path = where / "fake-c++"
    path.write_text(f"#!/bin/sh\necho 'fake-c++ {version}'\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _key(search: Path, zoo: Path) -> str:
    return cache_key.cache_key(cache_key.key_parts("mybackend:BACKEND", [str(search)], zoo))


def test_the_key_ignores_where_and_when_the_sources_were_written(tmp_path: Path) -> None:
    """Two runners check the same sources out into different places at different times: one key."""
    first, zoo = _package(tmp_path / "a"), _zoo(tmp_path / "zoo-a")
    second = tmp_path / "b"
    shutil.copytree(first, second)  # copytree keeps mtimes: change them
    for path in (second / "mybackend").iterdir():
        os.utime(path, (1_000_000_000, 1_000_000_000))
    other_zoo = tmp_path / "zoo-b" / "models"
    shutil.copytree(zoo, other_zoo)
    assert _key(first, zoo) == _key(second, other_zoo)


def test_the_key_changes_with_the_backend_the_zoo_torch_and_the_compiler(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    search, zoo = _package(tmp_path / "pkg"), _zoo(tmp_path / "zoo")
    monkeypatch.setenv("CXX", _fake_compiler(tmp_path, "1.0"))
    keys = {"first": _key(search, zoo)}

    (search / "mybackend" / "kernel.cpp").write_text("int f() { return 2; }\n")
    keys["backend"] = _key(search, zoo)

    (zoo / "simple.py").write_text("MODEL = 2\n")
    keys["zoo"] = _key(search, zoo)

    (tmp_path / "other").mkdir()
    monkeypatch.setenv("CXX", _fake_compiler(tmp_path / "other", "2.0"))
    keys["compiler"] = _key(search, zoo)

    def no_torch(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(cache_key.importlib.metadata, "version", no_torch)
    monkeypatch.setenv("CONFORMANCE_TORCH", "torch==2.13.0")
    keys["torch"] = _key(search, zoo)
    monkeypatch.setenv("CONFORMANCE_TORCH", "torch==2.14.0")
    keys["torch pin"] = _key(search, zoo)

    assert len(set(keys.values())) == len(keys), keys
    assert cache_key.key_parts("mybackend:BACKEND", [str(search)], zoo)["compiler"] == "fake-c++ 2.0"


def test_a_backend_that_cannot_be_found_still_gets_a_key_and_a_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cache_key.main(["--backend", "no_such_backend_package:BACKEND"]) == 0
    out, err = capsys.readouterr()
    assert len(out.strip()) == 24
    assert "no_such_backend_package" in err
