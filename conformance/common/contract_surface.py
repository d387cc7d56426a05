"""Every argument a caller can pass, drawn from the protocol's signatures (``conformance/protocol.py``) rather
than from a list of the mistakes someone thought of: the differential machine
(``conformance/common/protocol_machine.py``) makes each call on the backend under test and on the oracle, and
the oracle says whether it is an error.

* **Any parameter**: left out (a missing positional), ``None``, or a value of each other Python type
  (:data:`PYTHON_VALUES`).
* **A tensor** (an element of ``inputs`` or ``outputs=``): every dtype this torch build can make, every device
  type and index it can construct here (``meta`` included), rank 0, one more or one fewer dimension, a size
  of 0, 1 or far past any bound, every layout (sparse COO and CSR, channels-last, transposed, expanded with
  a zero stride), and the tensors a valid call may carry: requiring grad, an ``nn.Parameter``, an inference
  tensor (:func:`tensor_variants`).
* **A string** past its limit every way a limit can be counted: characters, UTF-8 bytes, UTF-16 units,
  grapheme clusters (:func:`limit_strings`).

A variant's name is the code that makes it (``"dtype:complex64"``, ``"device:meta"``, ``"type:dict"``), so
a shrunk failure prints as a call a reader can make.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch

__all__ = [
    "PYTHON_VALUES",
    "all_dtypes",
    "apply_tensor_variant",
    "devices",
    "limit_strings",
    "python_value",
    "tensor_variants",
]

#: A value of each Python type a caller may pass by mistake, by name (``type:<name>``; ``none``: None).
PYTHON_VALUES: dict[str, Callable[[], object]] = {
    "none": lambda: None,
    "bool": lambda: True,
    "int": lambda: 3,
    "float": lambda: 1.5,
    "str": lambda: "forward",
    "bytes": lambda: b"\x00forward",
    "bytearray": lambda: bytearray(b"forward"),
    "list": lambda: [],
    "tuple": lambda: (),
    "dict": lambda: {},
    "set": lambda: {"forward"},
    "object": object,
    "tensor": lambda: torch.ones(2),
}


def python_value(name: str) -> object:
    return PYTHON_VALUES[name]()


@functools.cache
def all_dtypes() -> tuple[str, ...]:
    """Every dtype of this torch build a tensor can be converted to with ``.to`` (quantized and bit dtypes,
    which no plain conversion makes, are left out), by name."""
    found = []
    for name in dir(torch):
        dtype = getattr(torch, name)
        if not isinstance(dtype, torch.dtype) or name != str(dtype).removeprefix("torch."):
            continue
        try:
            with warnings.catch_warnings():  # complex32: "experimental"; made all the same
                warnings.simplefilter("ignore")
                torch.zeros(2).to(dtype)
        except Exception:  # quantized, bits, barebones unsigned types: not constructible this way
            continue
        found.append(name)
    return tuple(sorted(found))


def devices() -> tuple[str, ...]:
    """Every device a tensor can be made on here: the host, each CUDA device, and ``meta`` (no memory)."""
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ("cpu", "meta", *(f"cuda:{i}" for i in range(cuda)))


#: The ways a tensor argument varies, beyond dtype and device: shape (``rank:0`` a scalar, ``rank:+1`` /
#: ``rank:-1``, ``size:0`` / ``size:1`` / ``size:huge`` of the last dimension), layout, and what a valid call
#: may carry (``requires-grad``, ``parameter``, ``inference``, ``expanded``, ``transposed``).
_SHAPE_AND_LAYOUT: tuple[str, ...] = (
    "rank:0", "rank:+1", "rank:-1", "size:0", "size:1", "size:huge", "layout:sparse_coo",
    "layout:sparse_csr", "layout:channels_last", "transposed", "expanded", "requires-grad", "parameter",
    "inference",
)  # fmt: skip


@functools.cache
def tensor_variants() -> tuple[str, ...]:
    """Every tensor variant this machine can construct (dtypes and devices as this build and host have)."""
    return (
        *(f"dtype:{d}" for d in all_dtypes()),
        *(f"device:{d}" for d in devices()),
        *_SHAPE_AND_LAYOUT,
        *(f"type:{name}" for name in PYTHON_VALUES),
    )


def apply_tensor_variant(t: torch.Tensor, variant: str) -> object:
    """``t`` changed as ``variant`` says (a new tensor; ``t`` itself is left alone)."""
    kind, _, arg = variant.partition(":")
    if kind == "type":
        return python_value(arg)
    if kind == "dtype":
        return t.to(getattr(torch, arg))
    if kind == "device":
        return t.to(arg) if arg != "meta" else torch.empty_like(t, device="meta")
    if kind == "rank":
        if arg == "0":
            return t.reshape(-1)[0].clone() if t.numel() else torch.zeros((), dtype=t.dtype, device=t.device)
        return t.unsqueeze(0).clone() if arg == "+1" else (t[0].clone() if t.dim() else t.clone())
    if kind == "size":
        if not t.dim():
            return t.clone()
        if arg == "0":
            return t.narrow(-1, 0, 0).clone()
        if arg == "1":
            return t.narrow(-1, 0, min(1, t.shape[-1])).clone()
        return t.repeat_interleave(64, dim=-1) if t.numel() else t.clone()  # far past any bound
    if kind == "layout":
        if arg == "sparse_coo":
            return t.to_sparse()
        if arg == "sparse_csr":
            return t.to_sparse_csr() if t.dim() == 2 else t.to_sparse()
        if t.dim() == 4:
            return t.contiguous(memory_format=torch.channels_last)
        return _transposed(t)
    if variant == "transposed":
        return _transposed(t)
    if variant == "expanded":  # every element of the last dimension one value: a zero stride
        return t.narrow(-1, 0, 1).expand(t.shape) if t.dim() and t.shape[-1] else t.clone()
    if variant == "requires-grad":
        return t.clone().requires_grad_(True) if t.is_floating_point() else t.clone()
    if variant == "parameter":
        return torch.nn.Parameter(t.clone(), requires_grad=t.is_floating_point())
    if variant == "inference":
        with torch.inference_mode():
            return t.clone()
    raise ValueError(f"unknown tensor variant {variant!r}")


def _transposed(t: torch.Tensor) -> torch.Tensor:
    """The same values as ``t``, laid out column-major (non-contiguous, same shape)."""
    if t.dim() < 2:
        return t.clone()
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def limit_strings(limit: int) -> tuple[str, ...]:
    """Strings at and past a limit of ``limit`` characters, counted every way a limit can be counted: the
    limit in code points of one UTF-8 byte, of two (``é``), of four (an emoji, two UTF-16 units), and in
    grapheme clusters made of two code points (``e`` + a combining accent)."""
    return (
        "a" * limit,
        "a" * (limit + 1),
        "é" * limit,  # within the limit in characters; twice it in UTF-8 bytes
        "é" * (limit + 1),
        "\U0001f600" * limit,  # within it in characters; four times in bytes, twice in UTF-16 units
        "\U0001f600" * (limit + 1),
        "e\u0301" * (limit // 2),  # within it in characters (2 per grapheme)
        "e\u0301" * (limit // 2 + 1),  # past it in characters, within it in graphemes
    )
