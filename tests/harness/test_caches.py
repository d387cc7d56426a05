"""Where a run keeps what makes the next process fast (harness/caches.py): the bytecode a run writes where
``$PYTHONDONTWRITEBYTECODE`` forbids writing it beside the sources."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness import caches


def test_bytecode_goes_under_the_artifact_cache_only_where_python_would_write_none(tmp_path: Path) -> None:
    forbidden = {"PYTHONDONTWRITEBYTECODE": "1", "CONFORMANCE_CACHE_DIR": str(tmp_path)}
    prefix = str(tmp_path / "pycache")
    assert caches.bytecode_env(forbidden) == {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": prefix}
    assert caches.bytecode_env({"CONFORMANCE_CACHE_DIR": str(tmp_path)}) == {}  # beside the sources, as ever
    assert caches.bytecode_env({**forbidden, "PYTHONDONTWRITEBYTECODE": ""}) == {}  # empty: not set
    assert caches.bytecode_env({**forbidden, "PYTHONPYCACHEPREFIX": "/theirs"}) == {}  # the user's place
    elsewhere = caches.bytecode_env(forbidden, tmp_path / "tests")
    assert elsewhere["PYTHONPYCACHEPREFIX"] == str(tmp_path / "tests")


def test_a_later_process_reads_the_bytecode_and_rewritten_tests_an_earlier_one_wrote(tmp_path: Path) -> None:
    """Real processes: a module imported and a test module collected by pytest leave their bytecode (the test
    module's rewritten by pytest) under the prefix, nothing beside the sources."""
    sources = tmp_path / "src"
    sources.mkdir()
    (sources / "helper.py").write_text("VALUE = 1\n")
    (sources / "test_it.py").write_text("import helper\n\ndef test_it():\n    assert helper.VALUE == 1\n")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "CONFORMANCE_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("PYTHONPYCACHEPREFIX", None)  # the self-tests' own (noxfile)
    env.update(caches.bytecode_env(env))
    collect = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "test_it.py"]
    done = subprocess.run(collect, cwd=sources, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    written = sorted(p.name for p in (tmp_path / "cache" / "pycache").rglob("*.pyc"))
    assert any(name.startswith("helper.") for name in written), written
    assert any(name.startswith("test_it.") and "pytest" in name for name in written), written
    assert not list(sources.rglob("__pycache__")), "bytecode was written beside the sources"
