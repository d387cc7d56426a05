"""One table of settings (``settings``): every resolver of a knob agrees, every ``CONFORMANCE_*`` name the
product code reads is in the table, and a bad value is named (issue 49 item 4)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import settings
from harness.caches import artifact_dir
from harness.run_history import keep_count
from reference_impl.artifact_cache import default_cache_dir
from runner import sizing
from settings import SettingError
from torch_aoti.package_cache import cache_dir

ROOT = Path(__file__).resolve().parents[2]
HOME = Path.home()
DEFAULT = HOME / ".cache" / "aoti-conformance"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, DEFAULT),
        ("", DEFAULT),
        ("   ", DEFAULT),
        ("~", HOME),
        ("~/cc ", HOME / "cc"),  # a CI `env:` passes `~` and stray spaces as written
        (" /abs/dir", Path("/abs/dir")),
        ("rel/dir", Path.cwd() / "rel" / "dir"),
        ("$HOME/x", HOME / "x"),
        ("/with space/d", Path("/with space/d")),
    ],
)
def test_every_cache_directory_resolver_agrees(
    monkeypatch: pytest.MonkeyPatch, value: str | None, expected: Path
) -> None:
    """The harness (cleaning, stamps, bytecode), the reference's artifact cache and the torch_aoti adapter's
    package cache name one directory for one value: they disagreed on ``~``, spaces and empty values."""
    if value is None:
        monkeypatch.delenv(settings.CACHE_DIR.name, raising=False)
    else:
        monkeypatch.setenv(settings.CACHE_DIR.name, value)
    assert artifact_dir() == expected
    assert default_cache_dir() == expected
    assert cache_dir() == expected / "torch_aoti"
    assert expected.is_absolute()


#: Product packages whose code may read a ``CONFORMANCE_*`` variable.
PRODUCT = ("harness", "conformance", "reports", "reference_impl", "torch_aoti", "upstream_executorch")


def test_every_setting_the_code_names_is_in_the_table() -> None:
    named: dict[str, str] = {}
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            for name in re.findall(r"CONFORMANCE_[A-Z][A-Z0-9_]*", path.read_text(encoding="utf-8")):
                named.setdefault(name, str(path.relative_to(ROOT)))
    for name in re.findall(r"CONFORMANCE_[A-Z][A-Z0-9_]*", (ROOT / "noxfile.py").read_text(encoding="utf-8")):
        named.setdefault(name, "noxfile.py")
    missing = {name: where for name, where in named.items() if name not in settings.SETTINGS}
    assert not missing, f"settings the code reads but the table lacks (add them to settings/): {missing}"


def test_every_setting_has_a_doc_and_a_default_that_needs_no_environment() -> None:
    for name, setting in settings.SETTINGS.items():
        assert name.startswith("CONFORMANCE_")
        assert setting.doc
        setting.default()  # never raises


@pytest.mark.parametrize(
    ("setting", "value", "rule"),
    [
        (settings.KEEP_RUNS, "many", r"must be a whole number \(0 or more\)"),
        (settings.WORKERS_PER_GPU, "0", "must be a whole number of at least 1"),
        (settings.CRASH_REPLAY_S, "inf", "must be a number of seconds >= 0"),
        (settings.PRELOWER, "maybe", "must be 0 or 1"),
        (settings.CACHE_DIR, "", None),  # empty is unset: the default
    ],
)
def test_a_bad_value_is_named_with_its_rule(
    setting: settings.Setting[object], value: str, rule: str | None
) -> None:
    env = {setting.name: value}
    if rule is None:
        assert setting.get(env) == setting.default()
        return
    with pytest.raises(SettingError, match=rf"^\${setting.name} {rule}, got '{value}'$"):
        setting.get(env)


def test_the_readers_use_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.KEEP_RUNS.name, "3")
    assert keep_count() == 3
    monkeypatch.setenv(settings.WORKERS_PER_GPU.name, "twelve")
    with pytest.raises(SettingError, match="CONFORMANCE_WORKERS_PER_GPU"):
        sizing.workers_override()


def test_set_in_lists_what_a_user_set_and_leaves_the_front_doors_own_out() -> None:
    env = {
        "CONFORMANCE_CACHE_DIR": "/c",
        "CONFORMANCE_START_GATE": "1:/g",
        "CONFORMANCE_RUN_ID": " ",
        "X": "1",
    }
    assert settings.set_in(env) == {"CONFORMANCE_CACHE_DIR": "/c"}
    assert settings.set_in(env, internal=True) == {
        "CONFORMANCE_CACHE_DIR": "/c",
        "CONFORMANCE_START_GATE": "1:/g",
    }


def test_the_table_prints_as_a_command() -> None:
    env = {**os.environ, "CONFORMANCE_KEEP_RUNS": "4", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "settings"], capture_output=True, text=True, env=env, check=True
    )
    assert "CONFORMANCE_KEEP_RUNS = '4'" in done.stdout
    assert done.stdout.count("CONFORMANCE_") == len(settings.SETTINGS)
