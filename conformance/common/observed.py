"""What a caller can observe of a call's return value, as data two backends' answers can be compared by:
its container and length, each tensor's class, dtype, shape, device, layout and ``requires_grad``, a
mapping's keys and the types of its values, a string's value. Where the contract lets backends differ (a
tensor's strides, a program's bytes, a handle's type, an error's wording: ``conformance/common/oracle.py``'s
``ALLOWED_DIFFERENCES``) nothing is recorded, so no such difference can fail.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from conformance.common.contract_monitor import overlaps

__all__ = ["shared_pairs", "structure", "structure_difference"]


def structure(value: object) -> Any:
    """``value`` as a caller observes it without reading numbers (see the module's doc)."""
    if isinstance(value, (list, tuple)):  # one level: a protocol call returns no deeper containers
        return {"container": type(value).__name__, "items": [_leaf(v) for v in value]}
    return _leaf(value)


def _leaf(value: object) -> Any:
    if isinstance(value, torch.Tensor):
        return {
            "class": type(value).__name__,
            "dtype": str(value.dtype).removeprefix("torch."),
            "shape": list(value.shape),
            "device": str(value.device),
            "layout": str(value.layout).removeprefix("torch."),
            "requires_grad": value.requires_grad,
        }
    if isinstance(value, (list, tuple)):
        return {"container": type(value).__name__, "items": len(value)}
    if isinstance(value, Mapping):
        return {
            "mapping": sorted(map(str, value)),
            "values": {str(k): type(v).__name__ for k, v in value.items()},
        }
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float, bytes, bytearray)):
        return type(value).__name__  # a count's value is judged elsewhere; bytes are the backend's format
    return "object"  # a handle: opaque, whatever its type


def structure_difference(got: object, want: object) -> str | None:
    """Where the structure ``got`` differs from ``want`` first, in words (None: nowhere)."""
    pairs: list[tuple[str, object, object]] = [("result", got, want)]
    if isinstance(got, dict) and isinstance(want, dict) and isinstance(got.get("items"), list):
        if got["container"] != want.get("container"):
            return f"result is a {got['container']}, the oracle's a {want.get('container')}"
        if not isinstance(want.get("items"), list) or len(got["items"]) != len(want["items"]):
            return f"result has {len(got['items'])} items, the oracle's {_count(want.get('items'))}"
        pairs = [
            (f"result[{i}]", g, w) for i, (g, w) in enumerate(zip(got["items"], want["items"], strict=True))
        ]
    for path, g, w in pairs:
        if isinstance(g, dict) and isinstance(w, dict) and g.keys() == w.keys():
            for key in g:
                if g[key] != w[key]:
                    return f"{path}'s {key} is {_short(g[key])}, the oracle's {_short(w[key])}"
        elif g != w:
            return f"{path} is {_short(g)}, the oracle's {_short(w)}"
    return None


def _count(items: object) -> object:
    return len(items) if isinstance(items, list) else items


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 160 else text[:157] + "..."


def shared_pairs(tensors: Sequence[object]) -> set[tuple[int, int]]:
    """The pairs ``(i, j)``, ``i < j``, of items of ``tensors`` that share an element of memory."""
    items = [(i, t) for i, t in enumerate(tensors) if isinstance(t, torch.Tensor)]
    return {(i, j) for n, (i, a) in enumerate(items) for j, b in items[n + 1 :] if overlaps(a, b)}
