"""Chapter metamorphic — programs lowered one after another in one process must each be their own (SPEC §1a).

A backend that caches compiled programs (every fast one does) must never serve a stale program: lowering a
model, then the same model changed in one thing, in one process and one cache, gives two programs that
each compute what their own eager module computes. And a ``lower`` that fails leaves nothing behind: the
next ``lower`` gives the program a fresh process would.

The variants (``conformance/models/variants.py``) each change one thing a cache key can miss: a weight, a
non-persistent buffer, a submodule's class, a plain attribute, a ``Dim`` bound. Rules read
``metamorphic/<rule>``; values are judged against float64 eager of each program's own module.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from conformance.common.checks import assert_model_output_close, fail
from conformance.common.parts import LoweringRuntimeBackend
from conformance.common.programs import handles, require_lowering_device
from conformance.common.rules import rule_id
from conformance.common.session import SPEC_KEY
from conformance.models.opaque import CallsOpaqueOp, opaque_inputs
from conformance.models.variants import BASE_MAX_ROWS, VARIANTS, build_variant, variant_inputs
from conformance.protocol import SKIP_D2H, LoweringBackend, RuntimeBackend, lower_options

TARGETS = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
ROOT = Path(__file__).resolve().parents[2]
#: A batch inside the wide variant's range and outside the base's.
WIDE_ROWS = BASE_MAX_ROWS + 4

# The rules this module checks (conformance/catalogue/rule_table.py).
VARIANT = rule_id("metamorphic/variant")
AFTER_FAILURE = rule_id("metamorphic/after-failure")


def _lower(backend: LoweringBackend, kind: str, device: str, rule: str) -> bytes:
    try:
        return backend.lower(build_variant(kind, device), device=device)
    except Exception as exc:
        fail(rule, f"lower({kind} model, device={device!r})", f"{type(exc).__name__}: {exc}")
    raise AssertionError("unreachable")


def _eager(kind: str, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    module = copy.deepcopy(build_variant(kind)["forward"][0]).to(torch.float64)
    with torch.no_grad():
        return module(*(t.detach().cpu().double() for t in inputs))


def _run(backend: RuntimeBackend, program: bytes, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    with handles(backend, program, "forward") as (handle,):
        return list(backend.execute(handle, list(inputs)))


def _check(backend: RuntimeBackend, rule: str, what: str, kind: str, program: bytes, rows: int) -> None:
    inputs = variant_inputs(rows)
    call = f"execute({what} program, x [{rows}, 16])"
    try:
        outputs = _run(backend, program, inputs)
    except Exception as exc:
        fail(rule, call, f"{type(exc).__name__}: {exc} (the {kind} model takes this input)")
    assert_model_output_close(rule, f"{call}: output 0", outputs[0], _eager(kind, inputs))


#: Every variant on the CPU target; on CUDA the weight variant (a fine-tuned checkpoint of one architecture:
#: the common case), since each variant is a compile of its own (45-60 s on a GPU runner's CPU).
VARIANT_CASES = [pytest.param("cpu", v, id=f"cpu-{v}") for v in VARIANTS] + [
    pytest.param("cuda", "weight", id="cuda-weight", marks=pytest.mark.gpu)
]


@pytest.mark.rules(VARIANT)
@pytest.mark.slow
@pytest.mark.parametrize(("device", "variant"), VARIANT_CASES)
def test_a_variant_lowered_after_its_base_is_its_own_program(
    runtime: LoweringRuntimeBackend, device: str, variant: str
) -> None:
    """metamorphic/variant: lower the base, then the variant, then the base again, in one process: each
    program matches its own module's float64 eager result (the dim-bound variant on a batch only it takes,
    and the base must still reject that batch)."""
    require_lowering_device(runtime, device)
    rule = VARIANT
    base = _lower(runtime, "base", device, rule)
    other = _lower(runtime, variant, device, rule)
    again = _lower(runtime, "base", device, rule)
    _check(runtime, rule, "the base", "base", base, 4)
    _check(runtime, rule, f"the {variant} variant's", variant, other, 4)
    _check(runtime, rule, "the base (lowered again)", "base", again, 4)
    if variant != "dim-bound":
        return
    _check(runtime, rule, "the dim-bound variant's", variant, other, WIDE_ROWS)
    call = f"execute(the base program lowered after the dim-bound variant, x [{WIDE_ROWS}, 16])"
    try:
        _run(runtime, again, variant_inputs(WIDE_ROWS))
    except ValueError:
        return
    except Exception as exc:
        fail(rule, call, f"must be an invalid-argument error (rows > {BASE_MAX_ROWS}), got {exc!r}")
    fail(rule, call, f"the base takes at most {BASE_MAX_ROWS} rows; it ran: the variant's program was served")


#: Lowers the base in a fresh interpreter and writes the program's bytes to ``argv[2]``.
_FRESH = textwrap.dedent(
    """
    import sys
    from harness.backend_loader import load_backend
    from conformance.models.variants import build_variant
    backend = load_backend(sys.argv[1])
    data = backend.lower(build_variant("base", sys.argv[3]), device=sys.argv[3])
    open(sys.argv[2], "wb").write(data)
    """
)


def _failing_lowers(backend: LoweringBackend, device: str) -> list[str]:
    """Make ``lower`` fail twice: an op no backend can lower, and (where the backend takes placement
    options) a placement naming a method the program does not have. Returns what was tried."""
    tried = []
    try:
        backend.lower({"forward": (CallsOpaqueOp(), opaque_inputs(device))}, device=device)
    except Exception:
        tried.append("an op with no kernel")
    if SKIP_D2H in lower_options(backend):
        try:
            options = {SKIP_D2H: {"no_such_method": False}}
            backend.lower(build_variant("base", device), device=device, options=options)
        except Exception:
            tried.append("a placement naming no method")
    return tried


@pytest.mark.rules(AFTER_FAILURE)
@pytest.mark.slow
@pytest.mark.parametrize("device", TARGETS)
def test_a_failed_lower_leaves_the_next_lower_as_a_fresh_process_makes_it(
    runtime: LoweringRuntimeBackend, device: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """metamorphic/after-failure: lower the base, make two lowers fail, lower the base again: the program
    runs and matches eager, and matches the program a fresh process lowers from the same model."""
    require_lowering_device(runtime, device)
    rule = AFTER_FAILURE
    _lower(runtime, "base", device, rule)
    tried = _failing_lowers(runtime, device)
    after = _lower(runtime, "base", device, rule)
    out = tmp_path / "fresh.program"
    spec = request.config.stash[SPEC_KEY]
    done = subprocess.run(
        [sys.executable, "-c", _FRESH, spec, str(out), device], cwd=ROOT, capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.fail(f"the fresh process could not lower the base model: {done.stderr[-2000:]}")
    fresh = out.read_bytes()
    inputs = variant_inputs(6, seed=9)
    what = f"after failed lowers ({', '.join(tried) or 'none failed'})"
    got = _run(runtime, after, inputs)[0].detach().cpu()
    want = _run(runtime, fresh, inputs)[0].detach().cpu()
    assert_model_output_close(rule, f"execute(the base program lowered {what})", got, _eager("base", inputs))
    assert_model_output_close(
        rule, "execute(the base program a fresh process lowered)", want, _eager("base", inputs)
    )
    if not torch.allclose(got, want, rtol=1e-5, atol=1e-6):
        fail(rule, f"the base program lowered {what}", "computes other values than a fresh process's program")
