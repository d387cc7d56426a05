"""Generated edge graphs for the view pass (SPEC §1a): what a backend's ReplaceViewCopyWithViewPass receives,
drawn by Hypothesis instead of written by hand.

The catalogue (``conformance/lowering/view_pass_cases.py``) holds one hand-picked graph per situation; a pass
can be wrong just beside them. Here a graph is data, a ``GraphSpec``
(``conformance/differential/graph_specs.py``: its inputs and a list of calls, each naming earlier values
``V(i)``), which ``build`` turns into the edge form a pass receives (``*_copy`` ops, ``meta["val"]`` on every
node, as ``torch.export`` leaves it) and fresh inputs; ``repr(spec)`` is Python that rebuilds it, so a shrunk
failure is a runnable repro (:meth:`GeneratedGraph.repro`).

:func:`graphs` is the strategy. It draws calls one at a time against the values built so far, run eagerly on
the side, so each call's arguments fit the shapes it meets; a call the op itself rejects is dropped, so every
graph runs. What it draws:

* **copies** of every view op with a ``*_copy`` twin (slice with steps, negative, open and past-the-end
  bounds written as exporters write them, select, split / split_with_sizes / unbind with their ``getitem``
  items, view and view.dtype, permute, transpose, t, expand, unsqueeze, squeeze, alias, detach, diagonal,
  unfold, as_strided), of inputs, of fresh values and of other copies;
* **writes**: in-place ops, ``copy_``, ``index_put_``, ``fill_``, an ``out=`` op, a ``call_method`` write and
  a ``_foreach`` list write, into an input, a fresh value, a copy, a live view or a list item;
* **users**: ordinary ops (pointwise, ``cat``, ``stack``, ``mm``, ``sum``), live views of a copy,
  ``call_method`` readers and a call without a schema (``torch.sin``);
* **outputs**: every value nothing reads (exported graphs have no dead code, and a copy nobody sees hides
  any slip) and up to two more (a copy's base, an input, a list), returned alone, as a tuple or in a list;
* **inputs** of 1-4 dimensions in float32, float64 or bfloat16, laid out contiguous, transposed, sliced with a
  step, at a storage offset, expanded or channels-last; their values are ±k/4 (k = 1..8): never zero, and
  exact through every op drawn here (reductions in float64 only), so results compare bit for bit whatever
  the summation order.

The draws lean where a pass slips: slices, selects and permutes most, a copy usually read by an ordinary op
(so a pass rewrites it and its readers see the view), dimensions wider than 1, slices written as exporters
write them and non-empty, permutations that move something. Self-tests measure what the section catches
(``tests/conformance/test_differential_view_pass.py``).

Deterministic under the suite's Hypothesis profile (``conformance/common/generation.py``). No backend is
imported.
"""

from __future__ import annotations

import functools
import itertools
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import reject
from hypothesis import strategies as st
from torch.fx import GraphModule

from conformance.differential.graph_specs import (
    DTYPES,
    Call,
    GraphSpec,
    InputSpec,
    InvalidCall,
    V,
    build,
    make_input,
    node_target,
    replace_refs,
)

__all__ = ["TO_THE_END", "GeneratedGraph", "graphs"]

Inputs = tuple[torch.Tensor, ...]

#: What export writes for "to the end" (``x[2:]`` is ``slice_copy(x, 0, 2, 9223372036854775807)``).
TO_THE_END = 2**63 - 1
#: view.dtype reinterprets the bytes: an integer dtype of the same size.
_SAME_SIZE_INT = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16}


# ============================================================================================ the graph


@dataclass(frozen=True)
class GeneratedGraph:
    """A drawn graph: its spec, and (built on first use) the graph and its inputs. The backend's pass gets a
    deep copy of ``module``; every run gets fresh copies of ``inputs``, laid out as they are."""

    spec: GraphSpec

    def __repr__(self) -> str:
        return repr(self.spec)

    @functools.cached_property
    def _built(self) -> tuple[GraphModule, Inputs]:
        try:
            return build(self.spec)
        except InvalidCall:
            reject()  # inside a Hypothesis case: not a graph a pass gets, draw another (never seen so far)
            raise

    @property
    def module(self) -> GraphModule:
        return self._built[0]

    @property
    def inputs(self) -> Inputs:
        return self._built[1]

    def repro(self) -> str:
        """The graph as a reader and as Python: input layouts, the graph's code, and the line that rebuilds
        it (what a failure message carries once Hypothesis has shrunk the graph)."""
        layouts = "; ".join(
            f"x{i}: {s.dtype}{list(s.shape)} {s.layout} (strides {t.stride()}, offset {t.storage_offset()})"
            for i, (s, t) in enumerate(zip(self.spec.inputs, self.inputs, strict=True))
        )
        code = "\n".join(line for line in self.module.code.strip().splitlines() if line.strip())
        rebuild = "import torch; from conformance.differential.graph_specs import *; "
        rebuild += f"module, inputs = build({self.spec!r})"
        return f"generated graph, inputs {layouts}:\n{code}\nrepro: {rebuild}"


def _exists(name: str) -> bool:
    try:
        node_target(name)
    except AttributeError:  # an op this torch version does not have
        return False
    return True


class _Builder:
    """The calls drawn so far, and each value from an eager run on the side (what the next calls must fit).
    The FX graph is made once, from the calls, when the drawing is done (``build``)."""

    def __init__(self, inputs: Sequence[InputSpec]) -> None:
        self.inputs = tuple(inputs)
        self.values: list[Any] = [make_input(spec) for spec in self.inputs]
        self.calls: list[Call] = []

    def call(self, call: Call) -> int:
        """Add ``call`` (run on the side first) and return its value's index; :class:`InvalidCall` if the
        op rejects it."""
        kind, target = node_target(call.target)
        args = replace_refs(call.args, self._value)
        kwargs = {k: replace_refs(v, self._value) for k, v in call.kwargs}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                value = (
                    getattr(args[0], target)(*args[1:], **kwargs)
                    if kind == "call_method"
                    else target(*args, **kwargs)
                )
        except Exception as exc:  # the op's own check: these arguments do not fit these values
            raise InvalidCall(f"{call}: {type(exc).__name__}: {exc}") from exc
        self.values.append(value)
        self.calls.append(call)
        return len(self.values) - 1

    def _value(self, ref: V) -> Any:
        return self.values[ref.index]

    def tensors(self) -> list[int]:
        """Indices of the values that are tensors (not lists, not None)."""
        return [i for i, v in enumerate(self.values) if isinstance(v, torch.Tensor)]


# ============================================================================================ drawing
# Strategies are made once (a strategy built inside every draw is validated again each time, which
# dominated shrinking) and choices are drawn as indices where the options depend on the graph so far.

_BOOL = st.booleans()


@functools.cache
def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


@functools.cache
def _one(options: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    """One of ``options``; Hypothesis shrinks towards the first."""
    return st.sampled_from(options)


@functools.cache
def _int_or(lo: int, hi: int, *also: Any) -> st.SearchStrategy[Any]:
    return st.one_of(st.integers(lo, hi), *(st.just(a) for a in also))


@functools.cache
def _int_lists(
    lo: int, hi: int, min_size: int, max_size: int, unique: bool = False
) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(lo, hi), min_size=min_size, max_size=max_size, unique=unique)


@functools.cache
def _perms(n: int) -> st.SearchStrategy[list[int]]:
    return st.permutations(range(n))


def _index(draw: st.DrawFn, options: Sequence[Any]) -> Any:
    """One of ``options`` (which depend on the graph so far), drawn as its index: shrinks to the first."""
    return options[draw(_ints(0, len(options) - 1))]


def _dim(draw: st.DrawFn, rank: int, *, extra: int = 0) -> int:
    """A dimension of a ``rank + extra``-d result, written positive or (as often) negative."""
    dims = rank + extra
    d = draw(_ints(0, dims - 1))
    return d - dims if draw(_BOOL) else d


def _wide_dim(draw: st.DrawFn, shape: tuple[int, ...]) -> int:
    """A dimension wider than 1 if there is one (a bound, a step or an index from the back is moot on a
    dimension of size 1), written positive or negative."""
    wide = [d for d, n in enumerate(shape) if n > 1]
    if not wide:
        return _dim(draw, len(shape))
    dim = _index(draw, wide)
    return dim - len(shape) if draw(_BOOL) else dim


def _reshapes(shape: tuple[int, ...]) -> list[list[int]]:
    """Shapes a ``view`` of ``shape`` may take: flattened, two neighbours merged, one split, a 1 added."""
    found: list[list[int]] = [[-1], [math.prod(shape)]]
    for d in range(len(shape) - 1):
        found.append([*shape[:d], shape[d] * shape[d + 1], *shape[d + 2 :]])
    for d, n in enumerate(shape):
        found += [[*shape[:d], a, n // a, *shape[d + 1 :]] for a in range(2, n) if n % a == 0]
        found.append([*shape[:d], -1, *shape[d + 1 :]])
    found.append([1, *shape])
    return found


# Weighted by how often exporters emit them (slices, selects and permutes most: every KV cache and
# attention block) and by how much a pass can get wrong with them (a permuted view's readers are permuted).
_VIEW_KINDS = (
    *("slice", "permute", "select", "slice", "transpose", "view", "slice", "expand", "select", "unfold"),
    *("slice", "permute", "diagonal", "as_strided", "unsqueeze", "split", "squeeze", "select", "alias"),
    *("split_with_sizes", "unbind", "t", "detach", "view_dtype", "slice", "permute", "transpose", "view"),
)
#: A permutation of one dimension moves nothing; a diagonal needs two.
_VECTOR_VIEW_KINDS = tuple(k for k in _VIEW_KINDS if k not in ("permute", "transpose", "diagonal"))
_SCALAR_VIEW_KINDS = ("view", "expand", "unsqueeze", "squeeze", "alias", "detach", "as_strided", "view_dtype")


def _view_call(draw: st.DrawFn, t: torch.Tensor) -> tuple[str, tuple[Any, ...]]:
    """A view op that fits ``t`` and its arguments after the base: (``op.overload``, args)."""
    rank, shape = t.dim(), tuple(t.shape)
    kind = draw(_one(_VIEW_KINDS if rank > 1 else _VECTOR_VIEW_KINDS if rank else _SCALAR_VIEW_KINDS))
    if kind == "slice":
        dim = _wide_dim(draw, shape)
        return "slice.Tensor", (dim, *_slice_bounds(draw, shape[dim]))
    if kind == "select":
        dim = _wide_dim(draw, shape)
        index = draw(_ints(0, max(shape[dim] - 1, 0)))
        return "select.int", (
            dim,
            index - shape[dim] if draw(_BOOL) else index,
        )  # x[:, -1] counts from the back
    if kind == "permute":
        perm = draw(_perms(rank))
        if perm == sorted(perm):  # Hypothesis favours the identity, which moves nothing
            perm = perm[::-1]
        return "permute.default", ([p - rank if draw(_BOOL) else p for p in perm],)
    if kind == "view":
        return "view.default", (_index(draw, _reshapes(shape)),)
    if kind == "view_dtype":
        return "view.dtype", (_SAME_SIZE_INT.get(t.dtype, t.dtype),)
    if kind == "expand":
        lead = draw(_int_lists(1, 3, 0, 1))
        sizes = [draw(_one((1, 2, 3, -1))) if n == 1 else draw(_one((n, -1))) for n in shape]
        return "expand.default", ([*lead, *sizes],)
    if kind == "transpose":
        first = _dim(draw, rank)
        second = (first + 1 + draw(_ints(0, rank - 2))) % rank  # two dimensions: one alone moves nothing
        return "transpose.int", (first, second - rank if draw(_BOOL) else second)
    if kind == "unsqueeze":
        return "unsqueeze.default", (_dim(draw, rank, extra=1),)
    if kind == "squeeze":
        form = draw(_one(("dim", "default", "dims"))) if rank else "default"
        if form == "dim":
            return "squeeze.dim", (_dim(draw, rank),)
        if form == "dims":
            return "squeeze.dims", (sorted(set(draw(_int_lists(0, rank - 1, 1, 2)))),)
        return "squeeze.default", ()
    if kind in ("alias", "detach"):
        return f"{kind}.default", ()
    if kind == "split":
        dim = _dim(draw, rank)
        return "split.Tensor", (draw(_ints(1, max(shape[dim], 1))), dim)
    if kind == "split_with_sizes":
        dim = _dim(draw, rank)
        cuts = sorted(set(draw(_int_lists(0, shape[dim], 0, 2))) | {0, shape[dim]})
        return "split_with_sizes.default", ([b - a for a, b in itertools.pairwise(cuts)], dim)
    if kind == "unbind":
        return "unbind.int", (_dim(draw, rank),)
    if kind == "diagonal" and rank >= 2:
        dim1, dim2 = draw(_perms(rank))[:2]
        return "diagonal.default", (draw(_ints(-2, 2)), dim1, dim2)
    if kind == "unfold":
        dim = _dim(draw, rank)
        return "unfold.default", (dim, draw(_ints(1, max(shape[dim], 1))), draw(_ints(1, 2)))
    if kind == "t":
        return ("t.default", ()) if rank <= 2 else ("transpose.int", (-2, -1))
    if kind == "as_strided":
        sizes = draw(_int_lists(1, 3, 1, 2))
        strides = draw(_int_lists(0, 3, len(sizes), len(sizes)))
        offset = draw(_int_or(0, 2, None))
        return "as_strided.default", (sizes, strides, *(() if offset is None else (offset,)))
    return "alias.default", ()


#: How ``x[...]`` reaches an edge graph (``slice_copy(x, dim, start, end[, step])``), then what a hand-written
#: graph may hold: bounds left out or None, past either end, empty.
_SLICE_FORMS = ("a:", ":-k", "a:b:s", "-k:", "::s", "a:b", "a:-k", ":b", "odd")


def _slice_bounds(draw: st.DrawFn, size: int) -> tuple[Any, ...]:
    """``(start, end[, step])`` of a slice of a dimension of ``size``, written as an exporter writes it;
    non-empty unless the form is ``odd``."""
    form = draw(_one(_SLICE_FORMS))
    if form == "odd":
        start, end = draw(_int_or(-size - 1, size + 1, None)), draw(_int_or(-size - 1, size + 1, None))
        return (start, end, draw(_ints(1, 3)))[: draw(_ints(0, 3))]
    start = draw(_ints(0, size - 1)) if size > 1 else 0
    end = draw(_ints(start + 1, size)) if size > 1 else size
    if form == "a:":
        return start, TO_THE_END
    if form == "a:b":
        return start, end
    if form == "::s":
        return 0, TO_THE_END, draw(_ints(2, 3))
    if form == "a:b:s":
        return start, end, draw(_ints(2, 3))
    if form == "-k:":
        return -draw(_ints(1, max(size, 1))), TO_THE_END
    if form in (":-k", "a:-k"):  # x[:, :-1]: all but the last k
        return (start if form == "a:-k" else 0), -draw(_ints(1, max(size - start - 1, 1)))
    return 0, end  # ":b"


def _pick(draw: st.DrawFn, b: _Builder, candidates: list[int] | None = None) -> int:
    """A tensor value: half the time the latest (graphs are chains more than fans), else any, latest first
    (so a shrunk graph reads what it just built)."""
    found = list(reversed(candidates if candidates is not None else b.tensors()))
    return found[0] if not draw(_BOOL) else _index(draw, found)


def _items(draw: st.DrawFn, b: _Builder, index: int) -> None:
    """``getitem`` nodes for some items of the list value ``index`` (a split, an unbind)."""
    count = len(b.values[index])
    if count:
        for item in sorted(draw(_int_lists(0, count - 1, 1, min(count, 3), unique=True))):
            b.call(Call("getitem", (V(index), item)))


def _view_like(draw: st.DrawFn, b: _Builder, *, copy: bool) -> None:
    """A ``*_copy`` of a value (``copy``), or a live view of it (an alias the graph later reads or writes)."""
    base = _pick(draw, b)
    op, args = _view_call(draw, b.values[base])
    name, overload = op.split(".")
    target = f"aten.{name}_copy.{overload}" if copy else f"aten.{op}"
    if not _exists(target):
        return
    index = b.call(Call(target, (V(base), *args)))
    if isinstance(b.values[index], (list, tuple)):
        _items(draw, b, index)
    elif copy and draw(_ints(0, 2)) < 2:  # mostly an ordinary reader: the pattern a pass should rewrite
        b.call(Call(draw(_one(("aten.mul.Tensor", "aten.add.Tensor"))), (V(index), 2.0)))


def _same(b: _Builder, t: torch.Tensor) -> list[int]:
    return [i for i in b.tensors() if b.values[i].shape == t.shape and b.values[i].dtype == t.dtype]


def _broadcasts_to(b: _Builder, shape: torch.Size) -> list[int]:
    found = []
    for i in b.tensors():
        try:
            if torch.broadcast_shapes(b.values[i].shape, shape) == shape:
                found.append(i)
        except RuntimeError:
            continue
    return found


#: ``fill_`` last: a constant makes every element alike, so it hides which element a view picks.
_WRITES = ("add_", "copy_", "index_put_", "out=", "method", "foreach", "mul_", "fill_")


def _write(draw: st.DrawFn, b: _Builder) -> None:
    """A write into a value: in place, ``copy_``, ``index_put_``, ``fill_``, ``out=``, a method, a list."""
    target = _pick(draw, b)
    t = b.values[target]
    kind = draw(_one(_WRITES))
    if kind == "add_":
        b.call(Call("aten.add_.Tensor", (V(target), draw(_one((100.0, 1.0, -3.0))))))
    elif kind == "mul_":
        b.call(Call("aten.mul_.Tensor", (V(target), -2.0)))
    elif kind == "fill_":
        b.call(Call("aten.fill_.Scalar", (V(target), 3.0)))
    elif kind == "method":
        b.call(Call("method:add_", (V(target), 10.0)))
    elif kind == "foreach":
        others = [i for i in b.tensors() if i != target]
        more = [_index(draw, others)] if others and draw(_BOOL) else []
        b.call(Call("aten._foreach_add_.Scalar", ([V(target), *map(V, more)], 10.0)))
    elif kind == "copy_":
        sources = [i for i in _broadcasts_to(b, t.shape) if i != target]
        if sources and draw(_BOOL):
            source = _pick(draw, b, sources)
        else:
            source = b.call(Call("aten.neg.default", (V(target),)))
        b.call(Call("aten.copy_.default", (V(target), V(source))))
    elif kind == "out=":
        source = _pick(draw, b, _same(b, t))
        b.call(Call("aten.add.out", (V(source), V(source)), (("out", V(target)),)))
    elif kind == "index_put_" and t.dim() >= 1 and t.shape[0] >= 1:
        count = draw(_ints(1, t.shape[0]))
        rows = b.call(Call("aten.arange.default", (count,), (("dtype", torch.int64),)))
        fill = b.call(Call("aten.full.default", ([], 7.0), (("dtype", t.dtype),)))
        b.call(Call("aten.index_put_.default", (V(target), [V(rows)], V(fill))))


_COMPUTE = ("mul", "add", "neg", "clone", "cat", "stack")
_COMPUTE_EXACT_SUMS = ("mm", *_COMPUTE, "sum")


def _compute(draw: st.DrawFn, b: _Builder) -> None:
    """A fresh value (a base nobody else holds) or an ordinary user of one."""
    source = _pick(draw, b)
    t = b.values[source]
    # A view can change a reduction's summation order (another kernel for a transposed operand): only
    # float64 keeps every partial sum of these values exact, so any order gives the same bits.
    exact_sums = t.dtype == torch.float64
    kind = draw(_one(_COMPUTE_EXACT_SUMS if exact_sums else _COMPUTE))
    if kind == "mm" and t.dim() != 2:
        kind = "mul"
    if kind == "mul":
        b.call(Call("aten.mul.Tensor", (V(source), 2.0)))
    elif kind == "add":
        b.call(Call("aten.add.Tensor", (V(source), V(_pick(draw, b, _broadcasts_to(b, t.shape))))))
    elif kind in ("neg", "clone"):
        b.call(Call(f"aten.{kind}.default", (V(source),)))
    elif kind in ("cat", "stack"):
        other = _pick(draw, b, _same(b, t))
        dim = _dim(draw, t.dim(), extra=1 if kind == "stack" else 0) if t.dim() or kind == "stack" else 0
        b.call(Call(f"aten.{kind}.default", ([V(source), V(other)], dim)))
    elif kind == "mm" and t.dim() == 2:
        fits = [i for i in b.tensors() if b.values[i].dim() == 2 and b.values[i].shape[0] == t.shape[1]]
        fits = [i for i in fits if b.values[i].dtype == t.dtype]
        if fits and draw(_BOOL):
            other = _pick(draw, b, fits)
        else:  # q @ k.T, as every attention block has it: a transposed copy as the second operand
            other = b.call(Call("aten.permute_copy.default", (V(source), [1, 0])))
        b.call(Call("aten.mm.default", (V(source), V(other))))
    elif kind == "sum" and t.dim() >= 1:
        b.call(Call("aten.sum.dim_IntList", (V(source), [_dim(draw, t.dim())])))


def _read_unusually(draw: st.DrawFn, b: _Builder) -> None:
    """A user the pass has no schema for: a ``call_method`` reader, or a plain Python function."""
    source = _pick(draw, b)
    kind = draw(_one(("method:add", "method:mul", "torch.sin")))
    b.call(Call(kind, (V(source),) if kind == "torch.sin" else (V(source), 2.0)))


#: Step kinds, repeated by weight (Hypothesis draws the first most, and shrinks towards it).
_STEPS: dict[str, Callable[[st.DrawFn, _Builder], None]] = {
    "copy": lambda draw, b: _view_like(draw, b, copy=True),
    "write": _write,
    "compute": _compute,
    "view": lambda draw, b: _view_like(draw, b, copy=False),
    "read": _read_unusually,
}
_WEIGHTED = ("copy", "write", "copy", "compute", "write", "copy", "view", "read")


#: Hypothesis draws the first options of a choice far more often than the last: the order is a weight.
#: An expanded input repeats its values (an index into it is moot), so it comes last.
_LAYOUTS_DRAWN = ("contiguous", "transposed", "sliced", "offset", "channels_last", "expanded")
#: Ranks and sizes, the most telling first: with a size of 1 a dimension's stride addresses nothing, so a
#: layout bug hides there (Hypothesis draws the first option most).
_RANKS, _SIZES = (2, 3, 1, 4), (3, 2, 4, 1)


def _input_spec(draw: st.DrawFn) -> InputSpec:
    shape = tuple(draw(_one(_SIZES)) for _ in range(draw(_one(_RANKS))))
    layout = draw(_one(_LAYOUTS_DRAWN))
    if (layout == "transposed" and len(shape) < 2) or (layout == "channels_last" and len(shape) != 4):
        layout = "contiguous"
    if layout == "expanded" and all(n == 1 for n in shape):
        layout = "contiguous"
    return InputSpec(shape, draw(_one(DTYPES)), layout, draw(_ints(0, 2**16)))


def _refs(value: Any) -> list[V]:
    found: list[V] = []
    replace_refs(value, found.append)
    return found


@st.composite
def graphs(draw: st.DrawFn, max_inputs: int = 2, min_steps: int = 4, max_steps: int = 12) -> GeneratedGraph:
    """An edge graph of ``*_copy`` ops, writes and users over 1..``max_inputs`` inputs and ``min_steps``..
    ``max_steps`` steps (a step is one to three calls). It returns every value nothing reads (an exported
    graph has no dead code, and a copy nobody sees can hide any slip) and up to two more (a copy's base,
    an input). At least four steps: a hazard needs a copy, a write and a read, and Hypothesis otherwise
    spends a third of its examples on one- and two-call graphs."""
    b = _Builder([_input_spec(draw) for _ in range(draw(_ints(1, max_inputs)))])
    for _ in range(draw(_ints(min_steps, max_steps))):
        try:
            _STEPS[draw(_one(_WEIGHTED))](draw, b)
        except InvalidCall:
            continue  # the call is not in the graph; its predecessors in this step stay (harmless)
    returnable = [i for i, v in enumerate(b.values) if isinstance(v, torch.Tensor) or _is_tensor_list(v)]
    latest_first = list(reversed(returnable))
    read = {ref.index for call in b.calls for ref in _refs((call.args, call.kwargs))}
    leaves = [i for i in latest_first if i not in read and i >= len(b.inputs)] or latest_first[:1]
    extra = [latest_first[i] for i in draw(_int_lists(0, len(latest_first) - 1, 0, 2, unique=True))]
    chosen = [V(i) for i in dict.fromkeys([*leaves, *extra])]
    form = draw(_one(("tuple", "single", "list")))
    outputs: Any = chosen if form == "list" else tuple(chosen)
    if form == "single" and len(chosen) == 1:
        outputs = chosen[0]
    return GeneratedGraph(GraphSpec(b.inputs, tuple(b.calls), outputs))


def _is_tensor_list(value: Any) -> bool:
    return (
        isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, torch.Tensor) for v in value)
    )
