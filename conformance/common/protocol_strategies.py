"""Hypothesis strategies for the differential state machine: the plans
(``conformance/common/protocol_plans.py``) its rules and the chapter's focused cases draw.

``lower`` plans (models of the menu, renamed methods, placement options written every way), ``set_option``
arguments breaking at most one, ``init`` name slips, executes breaking one argument or none, and the rounds
and calls the chapter aims at one thing each (:data:`PLACEMENT_FOCUSES`, :data:`EXECUTE_FOCUSES`).
"""

from __future__ import annotations

import unicodedata
from typing import Any

from hypothesis import strategies as st

from conformance.common.contract_surface import PYTHON_VALUES, tensor_variants
from conformance.common.protocol_plans import (
    BAD_INPUTS,
    MENU,
    OPAQUE,
    OUTPUT_KINDS,
    POSITIONAL,
    SIZES,
    SKIP_COPY_OPTION,
    VARIANT,
    InputsPlan,
    LowerPlan,
    OddArgument,
    OutputsPlan,
)
from conformance.common.strategies import (
    LAYOUTS,
    NAME_SETS,
    NAME_VARIANTS,
    lower_name_sets,
    option_keys,
    option_values,
    placement_values,
)
from conformance.protocol import SKIP_D2H, SKIP_H2D

__all__ = [
    "EXECUTE_FOCUSES",
    "INIT_NAMES",
    "PLACEMENT_FOCUSES",
    "broken_calls",
    "every_odd_argument",
    "execute_calls",
    "lower_plans",
    "odd_arguments",
    "option_calls",
    "placement_rounds",
    "surface_inputs",
    "valid_inputs_plans",
]

#: Every method name the menu's models use: what option values are written from.
MENU_METHODS: tuple[str, ...] = ("forward", "encoder", "decoder", "prefill", "decode")


def option_calls() -> st.SearchStrategy[tuple[object, object]]:
    """``set_option`` arguments breaking at most one: an odd value for the known key, or an odd key with a
    good value."""
    return st.one_of(
        st.tuples(st.just(SKIP_COPY_OPTION), option_values(MENU_METHODS)),
        st.tuples(option_keys((SKIP_COPY_OPTION,)), st.sampled_from(("", "forward", "encoder, decoder"))),
    )


def lower_plans() -> st.SearchStrategy[LowerPlan]:
    """A model of the menu (sometimes the one no backend can lower), its methods sometimes renamed, and
    placement options written every way a caller writes them."""

    @st.composite
    def plans(draw: st.DrawFn) -> LowerPlan:
        model = draw(st.sampled_from((*MENU, *MENU, OPAQUE)))
        zoo = LowerPlan(model).zoo_methods()
        names = draw(st.one_of(st.none(), lower_name_sets(len(zoo))))
        shown = tuple(names if names is not None else zoo)
        options: dict[str, Any] = {}
        for key in (SKIP_H2D, SKIP_D2H):
            if draw(st.integers(0, 2)) == 0:
                options[key] = draw(placement_values(shown))
        return LowerPlan(model, names, tuple(sorted(options.items())))

    return plans()


#: ``init`` name kinds: mostly the exact name, then every way a caller gets it wrong (the Unicode forms and
#: spacing, the slips that pass most easily, twice).
INIT_NAMES = st.sampled_from(
    NAME_VARIANTS[:1] * 6 + NAME_VARIANTS[1:] + ("nfd", "nfkc", "upper", "trailing-space")
)


#: What a round of :func:`placement_rounds` aims at: method names (renamed at ``lower``, misspelt at
#: ``init``), placement values written every way, and a placement against the runtime option set before the
#: ``lower`` or after it (a conflict is an error at ``lower`` and at ``init``).
PLACEMENT_FOCUSES: tuple[str, ...] = ("names", "unicode-names", "values", "option-first", "option-after")
#: The lower name sets with a name that another Unicode normal form writes differently.
UNICODE_NAME_SETS = {
    n: tuple(s for s in sets if any(unicodedata.normalize("NFKD", m) != m for m in s))
    for n, sets in NAME_SETS.items()
}


def placement_rounds(focus: str) -> st.SearchStrategy[tuple[object, bool, LowerPlan, int, str]]:
    """Arguments of :meth:`ProtocolMachine.lower_under_option` for one of :data:`PLACEMENT_FOCUSES`."""

    @st.composite
    def rounds(draw: st.DrawFn) -> tuple[object, bool, LowerPlan, int, str]:
        model = draw(st.sampled_from(MENU))
        zoo = LowerPlan(model).zoo_methods()
        if focus == "unicode-names":  # names whose normal forms differ, asked for in each form
            names: tuple[str, ...] | None = draw(st.sampled_from(UNICODE_NAME_SETS[len(zoo)]))
        elif focus == "names" or draw(st.booleans()):
            names = draw(lower_name_sets(len(zoo)))
        else:
            names = None
        shown = tuple(names if names is not None else zoo)
        known = tuple(n for n in shown if n) or ("forward",)
        if focus in ("names", "unicode-names"):
            options: dict[str, object] = {}
        elif focus == "values":
            options = {k: draw(placement_values(shown)) for k in (SKIP_H2D, SKIP_D2H) if draw(st.booleans())}
        else:  # a valid placement (bools, or mappings of the program's own names), to meet the option
            flags = st.one_of(
                st.booleans(), st.dictionaries(st.sampled_from(known), st.booleans(), max_size=3)
            )
            options = {k: draw(flags) for k in (SKIP_H2D, SKIP_D2H) if draw(st.booleans()) or k == SKIP_D2H}
        plan = LowerPlan(model, names, tuple(sorted(options.items())))
        some = st.one_of(st.sampled_from(known), st.just(", ".join(known)))
        option = draw(some) if focus.startswith("option") else ""
        kinds = {"names": NAME_VARIANTS, "unicode-names": ("nfd", "nfkc")}
        name = draw(st.sampled_from(kinds.get(focus, ("exact",))))
        return option, focus != "option-after", plan, draw(st.integers(0, 1)), name

    return rounds()


#: What a call of :func:`execute_calls` breaks: one way of breaking ``inputs`` or ``outputs=``, or nothing.
EXECUTE_FOCUSES: tuple[str, ...] = (
    *BAD_INPUTS,
    *(f"outputs-{k}" for k in OUTPUT_KINDS if k not in ("none", "provided")),
    "valid",
)


def execute_calls(handles: int, focus: str) -> st.SearchStrategy[tuple[int, bool, InputsPlan, OutputsPlan]]:
    """Arguments of :meth:`ProtocolMachine.execute_call` over ``handles`` live handles for one of
    :data:`EXECUTE_FOCUSES`: the handle, the option naming its method or not, the inputs and outputs."""
    if focus == "valid":
        calls = st.tuples(valid_inputs_plans(), st.sampled_from(("none", "provided")).map(OutputsPlan))
    elif focus.startswith("outputs-"):
        calls = st.tuples(valid_inputs_plans(), st.just(OutputsPlan(focus.removeprefix("outputs-"))))
    else:
        broken = st.builds(
            InputsPlan,
            seed=st.integers(0, 2**16),
            size=st.sampled_from(SIZES),
            bad=st.just(focus),
            bad_index=st.integers(0, 3),
            on_device=st.booleans(),
        )
        calls = st.tuples(broken, st.just(OutputsPlan()))
    return st.tuples(st.sampled_from(range(handles)), st.booleans(), calls).map(lambda c: (c[0], c[1], *c[2]))


def valid_inputs_plans() -> st.SearchStrategy[InputsPlan]:
    return st.builds(
        InputsPlan,
        seed=st.integers(0, 2**16),
        layouts=st.lists(st.sampled_from(LAYOUTS), min_size=1, max_size=3).map(tuple),
        size=st.sampled_from(SIZES),
        on_device=st.booleans(),
    )


#: Broken ``inputs``, weighted towards the slips that pass unnoticed most easily: a dtype converted, a
#: dynamic size past its bound, an empty input (a rejected count or ``None`` is hard to miss).
_BAD_WEIGHTED: tuple[str, ...] = (*BAD_INPUTS, "wrong-dtype", "size-above", "size-below", "empty-size")


def broken_calls() -> st.SearchStrategy[tuple[InputsPlan, OutputsPlan]]:
    """An execute that breaks one argument: ``inputs`` (without ``outputs=``), or ``outputs=`` (with valid
    inputs). The valid calls are ``execute_valid``'s."""
    broken_inputs = st.builds(
        InputsPlan,
        seed=st.integers(0, 2**16),
        layouts=st.just(("contiguous",)),
        size=st.sampled_from(SIZES),
        bad=st.sampled_from(_BAD_WEIGHTED),
        bad_index=st.integers(0, 3),
        on_device=st.booleans(),
    )
    broken_outputs = st.sampled_from(tuple(k for k in OUTPUT_KINDS if k not in ("none", "provided")))
    return st.one_of(
        st.tuples(broken_inputs, st.just(OutputsPlan())),
        st.tuples(valid_inputs_plans(), broken_outputs.map(OutputsPlan)),
        surface_inputs(tensor_variants()),
    )


#: Strings at and past a limit, every way a limit can be counted (``conformance/common/contract_surface.py``'s
#: ``limit_strings``): the limit in code points of 1, 2 and 4 UTF-8 bytes, and in two-code-point graphemes.
#: Limits: option keys 63 characters, values 255 (SPEC §1b); method names have no limit at ``init``.
_LIMITS: dict[tuple[str, str], int] = {
    ("set_option", "key"): 63,
    ("set_option", "value"): 255,
    ("get_option", "key"): 63,
}


def _limit_arguments() -> st.SearchStrategy[OddArgument]:
    return st.sampled_from(_limit_cases())


def _limit_cases() -> list[OddArgument]:
    return [
        OddArgument(method, parameter, "limit", unit, count)
        for (method, parameter), limit in _LIMITS.items()
        for unit, counts in (
            ("a", (limit, limit + 1)),
            ("é", (limit, limit + 1)),
            ("\U0001f600", (limit, limit + 1)),
            ("e\u0301", (limit // 2, limit // 2 + 1)),
        )
        for count in counts
    ]


def odd_arguments() -> st.SearchStrategy[OddArgument]:
    """One argument of one runtime call changed: left out, ``None`` or of another Python type (every
    parameter of every method, from ``POSITIONAL``), or a string at or past its limit."""
    parameters = st.sampled_from([(m, p) for m, ps in POSITIONAL.items() for p in ps])
    typed = st.builds(
        lambda mp, t: OddArgument(mp[0], mp[1], "type", t), parameters, st.sampled_from(tuple(PYTHON_VALUES))
    )
    missing = parameters.map(lambda mp: OddArgument(mp[0], mp[1], "missing"))
    return st.one_of(typed, typed, missing, _limit_arguments())


def surface_inputs(variants: tuple[str, ...]) -> st.SearchStrategy[tuple[InputsPlan, OutputsPlan]]:
    """An execute whose one input (or provided output) is changed by a tensor variant of
    ``conformance/common/contract_surface.py``: any dtype, device, rank, size or layout, or another Python
    value."""
    variant = st.sampled_from(variants).map(lambda v: VARIANT + v)
    inputs = st.builds(
        InputsPlan,
        seed=st.integers(0, 2**16),
        bad=variant,
        bad_index=st.integers(0, 3),
        on_device=st.booleans(),
    )
    outputs = st.tuples(valid_inputs_plans(), variant.map(OutputsPlan))
    return st.one_of(st.tuples(inputs, st.just(OutputsPlan())), outputs)


def every_odd_argument() -> list[OddArgument]:
    """Every argument :func:`odd_arguments` draws from, each once: the exhaustive round of the chapter."""
    pairs = [(m, p) for m, ps in POSITIONAL.items() for p in ps]
    typed = [OddArgument(m, p, "type", t) for m, p in pairs for t in PYTHON_VALUES]
    missing = [OddArgument(m, p, "missing") for m, p in pairs]
    return [*typed, *missing, *_limit_cases()]
