"""Hypothesis strategies for the protocol's arguments: tensors of every layout, sizes at and past a ``Dim``'s
bounds, option and placement values, method names.

Each strategy draws a *recipe* (a small frozen dataclass whose ``repr`` is the Python that makes it again),
not the object itself: a shrunk counterexample then prints as code a person can run, and the same recipe
builds the same tensor for the backend under test and for the oracle, on any device.

What the strategies aim at is what a backend gets wrong just beside the examples a person writes:

* a tensor of the right shape and dtype that is a transposed, step-sliced, offset, expanded or
  channels-last view (a runtime that reads ``data_ptr`` as contiguous reads the poison around it: NaN for
  floats, other valid values for integers, so the mistake shows in the values, never as a crash);
* a dynamic size at each edge of its ``Dim``'s range and just outside it;
* option values that are falsy, ``None``, of the wrong type, too long, with NUL or control characters,
  lists with spaces and empty items; placement mappings whose unknown, misspelt, case-variant or spaced
  names carry ``False`` as well as ``True``;
* method names in another Unicode normal form, another case, with surrounding whitespace, a prefix of the
  real name, or not a string at all.
"""

from __future__ import annotations

import functools
import math
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

__all__ = [
    "LAYOUTS",
    "NameVariant",
    "TensorRecipe",
    "dynamic_sizes",
    "lower_name_sets",
    "method_name_variants",
    "option_keys",
    "option_values",
    "placement_values",
    "tensor_recipes",
]

#: Every layout a tensor of a given shape may arrive in. ``contiguous`` is the one every example uses.
LAYOUTS: tuple[str, ...] = ("contiguous", "transposed", "sliced", "offset", "expanded", "channels-last")
_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "bool": torch.bool,
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class TensorRecipe:
    """A tensor of logical ``shape`` and ``dtype`` laid out as ``layout``; values from ``seed``.

    Floats are standard normal (scaled by ``scale``); integers are drawn from ``[low, high)``. Storage the
    view does not cover holds poison: NaN for floats, for integers valid values other than the view's, so a
    backend that reads past the view computes wrong numbers instead of crashing on an index."""

    shape: tuple[int, ...]
    dtype: str
    layout: str = "contiguous"
    seed: int = 0
    low: int = 0
    high: int = 8
    scale: float = 1.0

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    def values(self) -> torch.Tensor:
        """The logical values, contiguous on the CPU (the same for every layout of one seed)."""
        gen = torch.Generator().manual_seed(self.seed)
        dtype = self.torch_dtype
        if dtype.is_floating_point:
            return (torch.randn(self.shape, generator=gen, dtype=torch.float64) * self.scale).to(dtype)
        if dtype == torch.bool:
            return torch.randint(0, 2, self.shape, generator=gen).bool()
        return torch.randint(self.low, self.high, self.shape, generator=gen, dtype=dtype)

    def build(self, device: str | torch.device = "cpu") -> torch.Tensor:
        """The tensor, made directly on ``device`` so that its layout is the recipe's there too."""
        values = self.values()
        if self.layout == "expanded":
            values = _constant_along(values, _expand_dim(self.shape))
        values = values.to(device)
        return _lay_out(values, self.layout, self._poison())

    def _poison(self) -> float | int | bool:
        dtype = self.torch_dtype
        if dtype.is_floating_point:
            return math.nan
        if dtype == torch.bool:
            return True
        return self.high - 1  # valid, so an index input never crashes; wrong, so the values show it

    def with_layout(self, layout: str) -> TensorRecipe:
        return TensorRecipe(self.shape, self.dtype, layout, self.seed, self.low, self.high, self.scale)


def _expand_dim(shape: Sequence[int]) -> int | None:
    """The dimension an ``expanded`` layout broadcasts (stride 0): the first of size > 1."""
    return next((d for d, n in enumerate(shape) if n > 1), None)


def _constant_along(values: torch.Tensor, dim: int | None) -> torch.Tensor:
    if dim is None:
        return values
    return values.narrow(dim, 0, 1).expand_as(values).contiguous()


def _lay_out(values: torch.Tensor, layout: str, poison: float | int | bool) -> torch.Tensor:
    shape = tuple(values.shape)
    rank = len(shape)
    if layout == "contiguous" or values.numel() == 0:
        return values.clone()
    if layout == "transposed" and rank >= 2:
        return values.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "channels-last" and rank == 4:
        return values.contiguous(memory_format=torch.channels_last)
    if layout == "expanded":
        dim = _expand_dim(shape)
        if dim is not None:
            return values.narrow(dim, 0, 1).clone().expand(shape)
    if layout == "offset" or rank == 0:
        flat = torch.full((values.numel() + 7,), poison, dtype=values.dtype, device=values.device)
        view = flat[7:].view(shape)
        view.copy_(values)
        return view
    # "sliced", and the layouts a shape cannot take (transposed rank 1, channels-last not rank 4): every
    # other element of the largest dimension of a twice-as-large, poisoned storage.
    dim = max(range(rank), key=lambda d: shape[d])
    big_shape = list(shape)
    big_shape[dim] *= 2
    big = torch.full(big_shape, poison, dtype=values.dtype, device=values.device)
    view = _every_other(big, dim)
    view.copy_(values)
    return view


def _every_other(big: torch.Tensor, dim: int) -> torch.Tensor:
    index = [slice(None)] * big.dim()
    index[dim] = slice(None, None, 2)
    return big[tuple(index)]


@st.composite
def tensor_recipes(
    draw: st.DrawFn,
    shape: Sequence[int],
    dtype: torch.dtype,
    *,
    low: int = 0,
    high: int = 8,
    layouts: Sequence[str] = LAYOUTS,
) -> TensorRecipe:
    """A recipe of ``shape`` and ``dtype`` in any of ``layouts``, with its own seed."""
    return TensorRecipe(
        tuple(int(n) for n in shape),
        dtype_name(dtype),
        draw(st.sampled_from(tuple(layouts))),
        draw(st.integers(0, 2**16)),
        low,
        high,
    )


def dynamic_sizes(low: int, high: int) -> tuple[st.SearchStrategy[int], st.SearchStrategy[int]]:
    """(inside, outside) a ``Dim(min=low, max=high)``: each edge, the middle, and just past each edge."""
    inside = st.sampled_from(sorted({low, high, (low + high) // 2, min(high, low + 1)}))
    outside = st.sampled_from(sorted({n for n in (low - 1, high + 1, 0) if n >= 0 and not low <= n <= high}))
    return inside, outside


# ============================================================================================ names


@dataclass(frozen=True)
class NameVariant:
    """A method name as a caller might misspell it: ``kind`` says how it was derived from ``name``."""

    name: str
    kind: str

    def apply(self) -> object:
        name, kind = self.name, self.kind
        variants: dict[str, object] = {
            "exact": name,
            "upper": name.upper(),
            "title": name[:1].upper() + name[1:],
            "leading-space": " " + name,
            "trailing-space": name + " ",
            "trailing-newline": name + "\n",
            "nfd": unicodedata.normalize("NFD", name),
            "nfkc": unicodedata.normalize("NFKC", name),
            "prefix": name[:-1],
            "suffix": name + "_",
            "empty": "",
            "none": None,
            "bytes": name.encode(),
            "list": [name],
        }
        return variants[kind]


NAME_VARIANTS: tuple[str, ...] = (
    "exact", "upper", "title", "leading-space", "trailing-space", "trailing-newline", "nfd", "nfkc",
    "prefix", "suffix", "empty", "none", "bytes", "list",
)  # fmt: skip


@functools.cache  # built once per argument: building a strategy costs more than drawing
def method_name_variants(names: Sequence[str]) -> st.SearchStrategy[NameVariant]:
    """A name of ``names`` as given (half the time) or as a caller might get it wrong."""
    exact = st.builds(NameVariant, st.sampled_from(tuple(names)), st.just("exact"))
    other = st.builds(NameVariant, st.sampled_from(tuple(names)), st.sampled_from(NAME_VARIANTS[1:]))
    return st.one_of(exact, other)


#: Method names a program may be lowered with, beyond a model's own: composed (NFC) non-ASCII letters whose
#: NFD form differs, a compatibility character whose NFKC form differs (ﬁ), names that differ only in case
#: within one program. A fixed catalogue, not free text: a backend that caches by content lowers each name
#: set once, so a run (and its shrinking) stays within its time budget.
NAME_SETS: dict[int, tuple[tuple[str, ...], ...]] = {
    1: (("décodé",), ("Forward",), ("ﬁrst",), ("forward_v2",), (" forward",)),
    2: (("encodé", "décodé"), ("Step", "step"), ("ﬁrst", "second"), ("prefill", "prefill_"), ("a", " a")),
}
#: Names ``lower`` must refuse (a ``ValueError`` naming the method): empty, or with a NUL.
BAD_NAME_SETS: dict[int, tuple[tuple[str, ...], ...]] = {
    1: (("",), ("for\0ward",)),
    2: (("encoder", ""), ("enc\0oder", "decoder")),
}


def lower_name_sets(count: int) -> st.SearchStrategy[tuple[str, ...]]:
    """``count`` distinct method names for ``lower`` other than the model's own (see ``NAME_SETS``), now and
    then names it must refuse (``BAD_NAME_SETS``)."""
    return st.sampled_from(NAME_SETS[count] + BAD_NAME_SETS[count])


# ========================================================================================== options


@functools.cache  # built once per argument: building a strategy costs more than drawing
def option_keys(known: Sequence[str]) -> st.SearchStrategy[object]:
    """Option keys: the known ones (mostly), misspelt or case-variant ones, over-long ones, non-strings."""
    real = st.sampled_from(tuple(known))
    odd = st.one_of(
        real.map(str.upper),
        real.map(lambda k: " " + k),
        real.map(lambda k: k + "_"),
        st.sampled_from(("", "unknown_option", "x" * 63, "x" * 64, "k\0ey")),
        st.sampled_from((None, 1, b"skip_copy_output_to_cpu_for_method", ("k",))),
    )
    return st.one_of(real, real, real, odd)


def _joined(names: Sequence[str]) -> st.SearchStrategy[str]:
    separators = st.sampled_from((",", ", ", " , ", ",,", " ,", "\t,"))
    items = st.lists(st.sampled_from((*tuple(names), "")), min_size=0, max_size=4)
    return st.builds(lambda parts, sep: sep.join(parts), items, separators)


@functools.cache  # built once per argument: building a strategy costs more than drawing
def option_values(method_names: Sequence[str]) -> st.SearchStrategy[object]:
    """Values for ``skip_copy_output_to_cpu_for_method``: method lists written every way a person writes
    them, names a caller gets wrong, limits, forbidden characters, and values that are not strings."""
    names = tuple(method_names) or ("forward",)
    variant = method_name_variants(names).map(lambda v: v.apply()).filter(lambda v: isinstance(v, str))
    spaced = st.builds(lambda a, b: f"{a} , {b} ", variant, st.sampled_from(names))
    lists = st.one_of(_joined(names), spaced)
    limits = st.sampled_from(("", " ", ",", "a" * 255, "a" * 256, ",".join(names) + "," + "b" * 300))
    bad_chars = st.builds(
        lambda n, c: n + c, st.sampled_from(names), st.sampled_from(("\0", "\x01", "\x1f", "\x7f", "\x00x"))
    )
    not_strings = st.sampled_from((None, False, True, 0, 1, 1.5, [], list(names), b"forward", {"m": True}))
    return st.one_of(lists, lists, variant, limits, bad_chars, not_strings)


@functools.cache  # built once per argument: building a strategy costs more than drawing
def placement_values(method_names: Sequence[str]) -> st.SearchStrategy[object]:
    """Values for ``skip_h2d_for_method_inputs`` / ``skip_d2h_for_method_outputs``: bools, falsy and truthy
    non-bools, and mappings whose names are right, unknown, misspelt, case-variant or spaced, each carrying
    ``False`` or ``True`` (or a non-bool)."""
    names = tuple(method_names)
    bools = st.booleans()
    falsy = st.sampled_from((None, 0, "", [], {}, 0.0))
    truthy = st.sampled_from((1, "true", "yes", [True], 1.0))
    known = st.sampled_from(names) if names else st.just("forward")
    wrong = method_name_variants(names or ("forward",)).map(lambda v: v.apply())
    key = st.one_of(known, known, wrong.filter(lambda k: isinstance(k, (str, bytes, type(None)))))
    entry_value = st.one_of(bools, bools, bools, st.sampled_from((None, 0, 1, "False")))
    mappings = st.dictionaries(key, entry_value, min_size=0, max_size=3)
    return st.one_of(bools, bools, mappings, mappings, falsy, truthy)


# =========================================================================================== mm_out

#: Matrix sizes: the edges (0, 1), small primes and powers of two, and one past a power of two.
MM_SIZES: tuple[int, ...] = (0, 1, 2, 3, 5, 7, 8, 16, 17, 31, 64, 127)
#: How ``out`` is given: right (``contiguous``), or broken one way.
MM_OUTS: tuple[str, ...] = ("contiguous", "contiguous", "contiguous", "transposed", "sliced", "offset",
                            "wrong-shape", "wrong-dtype", "other-device")  # fmt: skip


@dataclass(frozen=True)
class MmOutPlan:
    """``mm_out(out, self, mat2)`` with ``self`` [m, k] and ``mat2`` [k, n] in ``dtype`` and the given
    layouts, ``out`` given as ``out`` says; ``out`` holds NaN before the call."""

    dtype: str
    m: int
    n: int
    k: int
    self_layout: str = "contiguous"
    mat2_layout: str = "contiguous"
    out: str = "contiguous"
    seed: int = 0

    def build(self, device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a = TensorRecipe((self.m, self.k), self.dtype, self.self_layout, self.seed).build(device)
        b = TensorRecipe((self.k, self.n), self.dtype, self.mat2_layout, self.seed + 1).build(device)
        out_dtype = _DTYPES[self.dtype] if self.out != "wrong-dtype" else torch.float64
        shape = (self.m, self.n) if self.out != "wrong-shape" else (self.n + 1, self.m)
        out_device = device
        if self.out == "other-device":
            out_device = "cpu" if torch.device(device).type == "cuda" else device
        layout = self.out if self.out in LAYOUTS else "contiguous"
        out = TensorRecipe(shape, dtype_name(out_dtype), layout, self.seed + 2).build(out_device)
        if out.numel():
            out.fill_(math.nan)
        return out, a, b


@st.composite
def mm_out_plans(draw: st.DrawFn) -> MmOutPlan:
    operand_layouts = ("contiguous", "transposed", "sliced", "offset", "expanded")
    return MmOutPlan(
        draw(st.sampled_from(("float32", "float16", "bfloat16"))),
        draw(st.sampled_from(MM_SIZES)),
        draw(st.sampled_from(MM_SIZES)),
        draw(st.sampled_from(MM_SIZES)),
        draw(st.sampled_from(operand_layouts)),
        draw(st.sampled_from(operand_layouts)),
        draw(st.sampled_from(MM_OUTS)),
        draw(st.integers(0, 2**16)),
    )
