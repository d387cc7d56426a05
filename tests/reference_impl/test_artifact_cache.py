"""The content-addressed artifact cache: hits and misses, keys, corruption, and racing processes.

Builds are cheap fake functions handed to the cache (its ``build`` argument), never AOTInductor compiles.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from reference_impl.artifact_cache import (
    CACHE_ENV_VAR,
    ArtifactCache,
    default_cache_dir,
    make_key,
    program_fingerprint,
)
from reference_impl.lowering.edge import to_edge_graph
from reference_impl.lowering.preprocess import artifact_key

ROOT = Path(__file__).resolve().parents[2]
KEY = "ab" + "0" * 62
OTHER_KEY = "cd" + "1" * 62


class Counter:
    """A fake build: returns fixed bytes and counts its calls."""

    def __init__(self, payload: bytes = b"artifact-bytes" * 100) -> None:
        self.payload = payload
        self.calls = 0

    def __call__(self) -> bytes:
        self.calls += 1
        return self.payload


@pytest.fixture
def cache(tmp_path: Path) -> ArtifactCache:
    return ArtifactCache(tmp_path / "cache")


# --- hits and misses


def test_miss_builds_and_stores_then_hit_does_not_rebuild(cache: ArtifactCache) -> None:
    build = Counter()
    first = cache.get_or_build(KEY, build)
    assert (first.hit, first.data, build.calls) == (False, build.payload, 1)
    assert first.path == cache.entry_path(KEY)
    assert first.path.read_bytes() == build.payload
    second = cache.get_or_build(KEY, build)
    assert (second.hit, second.data, build.calls) == (True, build.payload, 1)
    assert second.build_seconds == 0.0


def test_keys_are_independent(cache: ArtifactCache) -> None:
    cache.get_or_build(KEY, Counter(b"one"))
    other = cache.get_or_build(OTHER_KEY, Counter(b"two"))
    assert not other.hit
    assert cache.load(KEY) == b"one"
    assert cache.load(OTHER_KEY) == b"two"
    assert KEY in cache
    assert "f" * 64 not in cache


def test_digest_is_stored_beside_the_entry(cache: ArtifactCache) -> None:
    cache.get_or_build(KEY, Counter(b"payload"), describe={"what": "test"})
    digest, size = cache.digest_path(KEY).read_text().split()
    assert digest == hashlib.sha256(b"payload").hexdigest()
    assert int(size) == len(b"payload")
    description = json.loads(cache.description_path(KEY).read_text())
    assert description.pop("build_s") >= 0  # what the build cost, for a cold run's account
    assert description == {"what": "test"}


def test_a_failing_build_stores_nothing_and_releases_the_lock(cache: ArtifactCache) -> None:
    def broken() -> bytes:
        raise RuntimeError("compiler exploded")

    with pytest.raises(RuntimeError, match="compiler exploded"):
        cache.get_or_build(KEY, broken)
    assert cache.load(KEY) is None
    build = Counter()
    assert not cache.get_or_build(KEY, build).hit
    assert build.calls == 1


def test_build_must_return_bytes(cache: ArtifactCache) -> None:
    with pytest.raises(TypeError, match="must be bytes"):
        cache.get_or_build(KEY, lambda: "text")  # type: ignore[arg-type,return-value]
    assert cache.load(KEY) is None


@pytest.mark.parametrize("bad", ["", "abc", "../" + "a" * 61, "A" * 64, 42])
def test_keys_must_be_sha256_hex(cache: ArtifactCache, bad: object) -> None:
    with pytest.raises(ValueError, match="64 lowercase hex"):
        cache.get_or_build(bad, Counter())  # type: ignore[arg-type]


def test_default_location_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path / "here"))
    assert default_cache_dir() == tmp_path / "here"
    monkeypatch.delenv(CACHE_ENV_VAR)
    assert default_cache_dir() == Path.home() / ".cache" / "aoti-conformance"


# --- corruption


def _corrupt_flip(cache: ArtifactCache) -> None:
    path = cache.entry_path(KEY)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _corrupt_truncate(cache: ArtifactCache) -> None:
    path = cache.entry_path(KEY)
    path.write_bytes(path.read_bytes()[:-7])


def _corrupt_no_digest(cache: ArtifactCache) -> None:
    cache.digest_path(KEY).unlink()


def _corrupt_garbage_digest(cache: ArtifactCache) -> None:
    cache.digest_path(KEY).write_text("not a digest\n")


def _corrupt_missing_data(cache: ArtifactCache) -> None:
    cache.entry_path(KEY).unlink()


@pytest.mark.parametrize(
    "corrupt",
    [_corrupt_flip, _corrupt_truncate, _corrupt_no_digest, _corrupt_garbage_digest, _corrupt_missing_data],
)
def test_a_corrupt_entry_is_detected_removed_and_rebuilt(cache: ArtifactCache, corrupt) -> None:
    build = Counter()
    cache.get_or_build(KEY, build)
    corrupt(cache)
    assert cache.load(KEY) is None  # a plain read never returns bad bytes
    result = cache.get_or_build(KEY, build)
    assert (result.hit, result.data, build.calls) == (False, build.payload, 2)
    assert result.replaced_corrupt or (
        corrupt is _corrupt_missing_data and not cache.digest_path(KEY).exists()
    )
    assert cache.load(KEY) == build.payload
    assert cache.get_or_build(KEY, build).hit


def test_no_temp_files_are_left_behind(cache: ArtifactCache) -> None:
    cache.get_or_build(KEY, Counter())
    cache.put(KEY, b"replacement")
    leftovers = [p.name for p in cache.entry_path(KEY).parent.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
    assert cache.load(KEY) == b"replacement"


# --- two processes racing on one key

_RACER = textwrap.dedent(
    """
    import hashlib, json, os, sys, time
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from reference_impl.artifact_cache import ArtifactCache

    cache_dir, key, go, builds = sys.argv[1:5]

    def build():
        with open(builds, "a") as handle:
            handle.write(f"{{os.getpid()}}\\n")
        time.sleep(1.5)  # a slow compile: the other process must wait, not build too
        return b"compiled-once" * 1000

    while not os.path.exists(go):
        time.sleep(0.005)
    result = ArtifactCache(cache_dir).get_or_build(key, build)
    print(json.dumps({{"hit": result.hit, "sha": hashlib.sha256(result.data).hexdigest()}}))
    """
)


def test_two_processes_racing_on_one_key_build_once_and_agree(tmp_path: Path) -> None:
    script = tmp_path / "racer.py"
    script.write_text(_RACER.format(root=str(ROOT)))
    go, builds = tmp_path / "go", tmp_path / "builds.txt"
    racers = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / "cache"), KEY, str(go), str(builds)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    time.sleep(0.5)  # both are waiting for the start signal
    go.touch()
    outcomes = []
    for racer in racers:
        out, err = racer.communicate(timeout=120)
        assert racer.returncode == 0, err
        outcomes.append(json.loads(out.strip().splitlines()[-1]))
    assert len(builds.read_text().split()) == 1, "the artifact was built more than once"
    assert sorted(o["hit"] for o in outcomes) == [False, True]
    assert outcomes[0]["sha"] == outcomes[1]["sha"]


# --- keys of real exported programs


class Tiny(nn.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.linear = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))[:, :2]


def _key(*, dtype=torch.float32, rows=3, seed=0, view_pass=True, configs=None, cxx=None) -> str:
    module = Tiny(seed).to(dtype)
    edge = to_edge_graph(module, (torch.randn(rows, 8, dtype=dtype),))
    return artifact_key(
        edge, target=torch.device("cpu"), view_pass=view_pass, inductor_configs=configs, cxx=cxx
    )


@pytest.mark.proof
def test_the_same_program_gives_the_same_key_and_any_change_a_new_one() -> None:
    base = _key()
    assert _key() == base  # stable across exports (and, being content-based, across processes)
    variants = {
        "dtype": _key(dtype=torch.bfloat16),
        "shape": _key(rows=5),
        "weights": _key(seed=1),
        "pass off": _key(view_pass=False),
        "inductor option": _key(configs={"cpp.simdlen": 0}),
    }
    for what, key in variants.items():
        assert key != base, f"changing the {what} did not change the key"
    assert len(set(variants.values())) == len(variants)


def test_the_compiler_is_part_of_the_key(tmp_path: Path) -> None:
    module = Tiny()
    edge = to_edge_graph(module, (torch.randn(3, 8),))
    wrapper = tmp_path / "g++"
    wrapper.write_text('#!/bin/sh\nexec g++ "$@"\n')
    wrapper.chmod(0o755)
    cpu = torch.device("cpu")
    assert artifact_key(edge, target=cpu, cxx="g++") != artifact_key(edge, target=cpu, cxx=str(wrapper))


def test_fingerprint_hashes_tensor_contents() -> None:
    module = Tiny()
    edge = to_edge_graph(module, (torch.randn(3, 8),))
    before = make_key({"p": program_fingerprint(edge)})
    with torch.no_grad():
        next(iter(edge.state_dict.values())).add_(1e-3)
    assert make_key({"p": program_fingerprint(edge)}) != before


def test_cache_root_env_is_read_at_call_time(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from reference_impl.artifact_cache import default_cache

    monkeypatch.setenv(CACHE_ENV_VAR, os.fspath(tmp_path))
    assert default_cache().root == tmp_path


def test_the_compiler_is_resolved_without_importing_inductor_and_as_inductor_resolves_it() -> None:
    """A warm lowering (a memo hit) never needs inductor: resolving the compiler must not import it, and
    must name the compiler inductor names once it is imported."""
    script = (
        "import sys, json\n"
        "from reference_impl.artifact_cache import compiler_identity\n"
        "before = compiler_identity()\n"
        "imported = 'torch._inductor.config' in sys.modules\n"
        "import torch._inductor.config\n"
        "print(json.dumps([imported, before == compiler_identity()]))\n"
    )
    env = {**os.environ, "CXX": "g++"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout.splitlines()[-1]) == [False, True]
