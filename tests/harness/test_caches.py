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


def test_a_kept_cache_is_pruned_of_what_none_of_the_last_runs_used(tmp_path: Path) -> None:
    """Issue 50 item 1: a cache carried between CI runs stays bounded. Entries are marked used by the
    backends' caches (mtime); what none of the last N runs used goes, lock files and the run log stay."""
    root = tmp_path / "cache"
    env = {"CONFORMANCE_CACHE_DIR": str(root)}
    for start, run in ((100.0, "a"), (200.0, "b"), (300.0, "c")):
        caches.note_run(run, now=start, env=env)
    files = {
        "v1/ab/old.bin": 150.0,  # used last by run a
        "v1/ab/new.bin": 250.0,  # used by run b
        "v1/locks/old.lock": 50.0,  # a lock file: never removed
        "torch_aoti/pkg.pt2": 310.0,  # used by run c
        "gone/only.bin": 120.0,  # its folder empties
    }
    for name, mtime in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 10)
        os.utime(path, (mtime, mtime))
    assert caches.prune_unused(root, 4).files == 0  # three runs noted: nothing is stale yet
    done = caches.prune_unused(root, 2)  # runs b and c: run a's entries go
    assert (done.files, done.bytes) == (2, 20)
    kept = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert kept == ["runs.log", "torch_aoti/pkg.pt2", "v1/ab/new.bin", "v1/locks/old.lock"]
    assert not (root / "gone").exists()
    out = subprocess.run(
        [sys.executable, "-m", "harness.caches", "--prune-unused-runs", "1"],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "pruned 1 file(s), 10.00 B unused in the last 1 runs" in out.stdout, out.stdout  # run b's


def test_the_backends_caches_mark_an_entry_used_when_they_hand_it_out(tmp_path: Path) -> None:
    from reference_impl.artifact_cache import ArtifactCache

    cache = ArtifactCache(tmp_path / "ref")
    key = "0" * 64
    path = cache.put(key, b"program")
    os.utime(path, (1.0, 1.0))
    assert cache.load(key) == b"program"
    assert path.stat().st_mtime > 1.0


def test_the_stamps_and_verdicts_a_run_reads_are_marked_used_too(tmp_path: Path) -> None:
    """What a warm run reads beside the entries (the pre-lowering's stamp, a vector-ISA verdict) is not
    pruned as unused: pruned, the next run would lower every program again or probe the ISA again."""
    from conformance.suite.prelower import found
    from reference_impl.lowering import vec_isa

    stamp, verdict = tmp_path / "prelower" / "x.done", tmp_path / "records" / "vec-isa-x.json"
    for path, text in ((stamp, "done\n"), (verdict, '{"ok": true}')):
        path.parent.mkdir()
        path.write_text(text)
        os.utime(path, (1.0, 1.0))
    assert found(stamp)
    assert not found(tmp_path / "prelower" / "missing.done")
    assert vec_isa._read(verdict) is True
    assert stamp.stat().st_mtime > 1.0
    assert verdict.stat().st_mtime > 1.0
