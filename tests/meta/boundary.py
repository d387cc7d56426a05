"""Representable values on either side of a bound: what "just inside" and "just past" mean in a dtype."""

from __future__ import annotations

import torch

_INT_OF_SIZE = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def neighbour(x: torch.Tensor, steps: int) -> torch.Tensor:
    """The value ``steps`` representable numbers above (below, if negative) non-negative finite ``x``.

    For non-negative floats the bit pattern, read as an integer, is monotone in the value, so adding to
    it walks the representable numbers one by one (subnormals included).
    """
    int_type = _INT_OF_SIZE[x.element_size()]
    return (x.view(int_type) + steps).view(x.dtype)


def straddle(ref: float, bound: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inside, past)``: the largest ``dtype`` value with ``value - ref <= bound`` and the next one up.

    ``ref`` must be non-negative and representable in ``dtype``; errors are taken in float64, as the
    checks take them.
    """
    value = torch.tensor(ref + bound, dtype=torch.float64).to(dtype)
    while float(value.double()) - ref > bound:
        value = neighbour(value, -1)
    while float(neighbour(value, 1).double()) - ref <= bound:
        value = neighbour(value, 1)
    past = neighbour(value, 1)
    assert float(value.double()) - ref <= bound < float(past.double()) - ref
    return value, past
