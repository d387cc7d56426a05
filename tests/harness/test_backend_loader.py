"""Loading the backend under test: --backend / environment / default, and clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.protocol import MmOutBackend, missing_attributes
from harness.backend_loader import (
    BACKEND_ENV_VAR,
    BACKEND_PATH_ENV_VAR,
    DEFAULT_BACKEND,
    BackendLoadError,
    backend_path,
    backend_spec,
    load_backend,
    use_backend_path,
)

ROOT = Path(__file__).resolve().parents[2]


def test_default_backend_is_the_reference_and_implements_mm_out() -> None:
    backend = load_backend(DEFAULT_BACKEND)
    assert backend.name == "reference_impl"
    assert isinstance(backend, MmOutBackend)
    assert missing_attributes(backend, "mm_out") == []


def test_command_line_wins_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BACKEND_ENV_VAR, "env_module:attr")
    assert backend_spec("cli_module:attr") == "cli_module:attr"
    assert backend_spec(None) == "env_module:attr"
    monkeypatch.delenv(BACKEND_ENV_VAR)
    assert backend_spec(None) == DEFAULT_BACKEND


def test_dotted_attribute_path() -> None:
    backend = load_backend("tests.broken.basic:ACCEPTS_CPU_TENSORS")
    assert backend.name == "accepts-cpu-tensors"


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("no_colon_here", "must have the form 'module:attr'"),
        (":attr", "must have the form"),
        ("module:", "must have the form"),
        ("no_such_module_xyz:BACKEND", "cannot import module 'no_such_module_xyz'"),
        ("reference_impl:NO_SUCH_ATTR", "has no attribute 'NO_SUCH_ATTR'"),
        ("tests.broken.basic:_Wrapped", "lacks the protocol identity"),
    ],
)
def test_bad_specs_give_clear_errors(spec: str, words: str) -> None:
    with pytest.raises(BackendLoadError, match=None) as info:
        load_backend(spec)
    assert words in str(info.value)
    assert repr(spec) in str(info.value)


def test_backend_without_a_part_reports_what_it_lacks() -> None:
    assert missing_attributes(load_backend("tests.broken.basic:NO_PARTS"), "mm_out") == ["mm_out"]


# ----------------------------------------------------------------------------------------------- backend path

#: A backend package outside the repository, as a user's would be: the reference's view pass, its own name.
OUTSIDE_PACKAGE = '''"""A backend that lives in its own repository."""
from reference_impl import BACKEND as _REFERENCE


class Outside:
    name = "outside"
    version = "0.1"

    def view_copy_pass(self, graph_module):
        return _REFERENCE.view_copy_pass(graph_module)


BACKEND = Outside()
'''


def outside_package(root: Path, name: str) -> Path:
    package = root / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(OUTSIDE_PACKAGE)
    return root


def test_a_package_outside_the_repository_loads_from_backend_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(BACKEND_PATH_ENV_VAR, raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    name = f"outside_{tmp_path.name.replace('-', '_')}"
    with pytest.raises(BackendLoadError) as missing:
        load_backend(f"{name}:BACKEND")
    # The error says what to do about it.
    assert f"cannot import module {name!r}" in str(missing.value)
    assert f"pass the directory that holds {name!r} with --backend-path DIR" in str(missing.value)
    directory = outside_package(tmp_path / "src", name)
    dirs = backend_path(str(directory))
    use_backend_path(dirs)
    assert os.environ[BACKEND_PATH_ENV_VAR] == str(directory)  # every process the run starts finds it too
    assert load_backend(f"{name}:BACKEND").name == "outside"
    with pytest.raises(BackendLoadError, match="no such directory"):
        use_backend_path(backend_path(str(tmp_path / "nowhere")))


@pytest.mark.proof
def test_repro_lines_carry_the_backend_path_and_run_as_printed(tmp_path: Path) -> None:
    """From a backend package outside the repository to a repro line that runs as printed."""
    from tests.conformance.test_suite_catches_broken_backends import start_chapter

    name = f"outside_{tmp_path.name.replace('-', '_')}"
    directory = outside_package(tmp_path / "src", name)
    select = ("-k", "test_view_pass_verdicts and every-view-twin/slice_copy", f"--backend-path={directory}")
    code, run, output = start_chapter(
        tmp_path, f"{name}:BACKEND", *select, chapter="conformance/lowering/test_lowering.py"
    )()
    assert code == 0, output
    assert run.metadata["backend"]["path"] == [str(directory)]
    passed = [case for case in run.cases if case.outcome == "passed"]
    assert passed, output
    repro = passed[0].repro
    assert repro.endswith(f"--backend {name}:BACKEND --backend-path {directory}"), repro
    # As printed, from the repository root, with the run's own interpreter in place of `python`.
    command = repro.replace("python -m pytest", f"{sys.executable} -m pytest -p no:cacheprovider", 1)
    env = {k: v for k, v in os.environ.items() if k != BACKEND_PATH_ENV_VAR}
    done = subprocess.run(command, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
