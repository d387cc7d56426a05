"""Export-time device placement in the reference backend: validation, the blob record, the runtime's rules.

CPU tests run everywhere (a CPU target accepts placement and changes nothing); the CUDA ones run on the GPU
machine and skip with the reason elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from reference_impl import BACKEND
from reference_impl.format.blob import pack_blob
from reference_impl.format.placement import (
    SKIP_D2H,
    SKIP_H2D,
    MethodPlacement,
    PlacementError,
    placement_conflicts,
    resolve_placement,
)
from reference_impl.format.program import build_program, program_to_bytes
from reference_impl.runtime import InputError, RuntimeArgumentError, destroy, execute, execute_stats, init
from reference_impl.runtime import options as opts
from reference_impl.runtime.options import SKIP_COPY_OUTPUT_TO_CPU_FOR_METHOD as SKIP
from tests.reference_impl.runtime_support import _two_out_export_args, compiled_artifact

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
METHODS = ("prefill", "decode")


@pytest.fixture(autouse=True)
def _reset_options() -> Iterator[None]:
    opts.reset_options()
    yield
    opts.reset_options()


# --- resolving the options ------------------------------------------------------------------------------


def test_bool_covers_every_method_and_mapping_only_the_named_ones() -> None:
    got = resolve_placement({SKIP_H2D: True, SKIP_D2H: {"decode": True}}, METHODS)
    assert got == {
        "prefill": MethodPlacement(inputs_on_device=True, outputs_on_device=None),
        "decode": MethodPlacement(inputs_on_device=True, outputs_on_device=True),
    }
    assert resolve_placement({}, METHODS) == dict.fromkeys(METHODS, MethodPlacement())


@pytest.mark.parametrize("key", [SKIP_H2D, SKIP_D2H])
@pytest.mark.parametrize(
    ("value", "words"),
    [
        ({"decoder": True}, ["unknown method", "'decoder'", "prefill"]),
        ({"decode": 1}, ["'decode'", "must be a bool", "int"]),
        ({"decode": None}, ["must be a bool", "NoneType"]),
        ("true", ["must be a bool", "mapping", "str"]),
        (1, ["must be a bool", "int"]),
        (["decode"], ["must be a bool", "list"]),
    ],
    ids=["unknown-method", "int-in-mapping", "none-in-mapping", "str", "int", "list"],
)
def test_bad_values_name_the_key_and_the_rule(key: str, value: object, words: list[str]) -> None:
    with pytest.raises(PlacementError) as info:
        resolve_placement({key: value}, METHODS)
    assert key in str(info.value)
    for word in words:
        assert word in str(info.value)


def test_conflicts_are_methods_fixed_to_host_outputs_and_named_at_runtime() -> None:
    placements = resolve_placement({SKIP_D2H: {"prefill": False, "decode": True}}, METHODS)
    assert placement_conflicts(placements, {"prefill", "decode"}) == ["prefill"]
    assert placement_conflicts(resolve_placement({}, METHODS), {"prefill"}) == []


@pytest.mark.parametrize(
    "raw",
    [{"x": 1}, {SKIP_H2D: 1, SKIP_D2H: None}, [True, False]],
    ids=["keys", "non-bool", "list"],
)
def test_malformed_blob_placement_is_rejected(raw: Any) -> None:
    with pytest.raises(PlacementError, match="placement"):
        MethodPlacement.from_json(raw)


def test_blob_placement_round_trips_and_old_blobs_have_none() -> None:
    placement = MethodPlacement(True, False)
    assert MethodPlacement.from_json(placement.to_json()) == placement
    assert MethodPlacement.from_json(None) == MethodPlacement()


# --- lower(): validated before anything compiles --------------------------------------------------------


class _Boom(nn.Module):
    """Fails if lowering ever gets as far as running the module: validation must come first."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("lower() compiled before validating its options")


def _boom_methods() -> dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    return {name: (_Boom(), (torch.ones(2),)) for name in METHODS}


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({SKIP_D2H: {"decoder": True}}, [SKIP_D2H, "unknown method"]),
        ({SKIP_H2D: "yes"}, [SKIP_H2D, "must be a bool"]),
        ({"skip_d2h_for_method_output": True}, ["unknown key", "skip_d2h_for_method_output"]),
        ({"view_pass": "no"}, ["view_pass", "bool"]),
    ],
    ids=["unknown-method", "non-bool", "misspelt-key", "view-pass"],
)
def test_lower_rejects_bad_options_before_compiling(options: dict[str, object], words: list[str]) -> None:
    with pytest.raises(ValueError, match=words[0]) as info:
        BACKEND.lower(_boom_methods(), device="cpu", options=options)
    for word in words:
        assert word in str(info.value)


def test_lower_rejects_a_conflict_with_the_runtime_option() -> None:
    opts.set_option(SKIP, "decode")
    with pytest.raises(PlacementError) as info:
        BACKEND.lower(_boom_methods(), device="cpu", options={SKIP_D2H: {"decode": False}})
    assert SKIP_D2H in str(info.value)
    assert SKIP in str(info.value)


# --- the runtime reads the placement from the blob ------------------------------------------------------


def _program(device: str, placement: MethodPlacement) -> bytes:
    artifact, io = compiled_artifact("two_out", _two_out_export_args, device)
    blob = pack_blob(
        artifact,
        method_name="forward",
        device=device,
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
        extra={"io": io, "placement": placement.to_json()},
    )
    return program_to_bytes(build_program([("forward", blob)]))


def _inputs(device: str = "cpu") -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randn(4, 64, generator=g).to(device) for _ in range(2)]


def test_cpu_target_accepts_placement_and_changes_nothing() -> None:
    handle = init(_program("cpu", MethodPlacement(True, True)), "forward")
    try:
        x, y = _inputs()
        out = execute(handle, [x, y])
        assert [t.device.type for t in out] == ["cpu", "cpu"]
        torch.testing.assert_close(out[0], x + y)
        assert execute_stats(handle) == {"h2d_bytes": 0, "d2h_bytes": 0}
    finally:
        destroy(handle)


def test_init_rejects_a_method_fixed_to_host_outputs_that_the_option_names() -> None:
    program = _program("cpu", MethodPlacement(None, False))
    opts.set_option(SKIP, "forward")
    with pytest.raises(RuntimeArgumentError) as info:
        init(program, "forward")
    assert SKIP_D2H in str(info.value)
    assert SKIP in str(info.value)


@needs_cuda
def test_device_inputs_method_rejects_host_inputs_and_copies_nothing() -> None:
    handle = init(_program("cuda", MethodPlacement(True, None)), "forward")
    try:
        host = _inputs()
        with pytest.raises(InputError, match=r"inputs\[0\].*skip_h2d_for_method_inputs"):
            execute(handle, host)
        dev = [t.cuda() for t in host]
        out = execute(handle, dev)
        assert [t.device.type for t in out] == ["cpu", "cpu"]
        torch.testing.assert_close(out[0], host[0] + host[1])
        assert execute_stats(handle) == {"h2d_bytes": 0, "d2h_bytes": 2 * 4 * 64 * 4}
    finally:
        destroy(handle)


@needs_cuda
@pytest.mark.parametrize(
    ("fixed", "option", "on_device"), [(True, "", True), (False, "", False), (None, "forward", True)]
)
def test_export_time_placement_wins_over_the_runtime_option(
    fixed: bool | None, option: str, on_device: bool
) -> None:
    handle = init(_program("cuda", MethodPlacement(None, fixed)), "forward")
    try:
        opts.set_option(SKIP, option)
        if fixed is False:
            opts.set_option(SKIP, "forward")  # after init: export time still wins
        out = execute(handle, _inputs())
        assert all(t.is_cuda == on_device for t in out)
        assert execute_stats(handle)["d2h_bytes"] == (0 if on_device else 2 * 4 * 64 * 4)
    finally:
        destroy(handle)
