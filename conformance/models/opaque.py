"""A method no backend can lower: it calls an op with no kernel on any device (only a shape function).

Used where the suite needs ``lower`` to fail: the lowering chapter's unsupported-kernel cases and the
differential chapter's failing lowers in the middle of a sequence.
"""

from __future__ import annotations

import torch

OPAQUE_OP = "conformance_suite::opaque_scale"


@torch.library.custom_op(OPAQUE_OP, mutates_args=())
def opaque_scale(x: torch.Tensor) -> torch.Tensor:
    """An op with no kernel on any device (only a shape function): no backend can provide its kernel, so
    no backend can lower a method calling it into a program that runs."""
    raise NotImplementedError(f"{OPAQUE_OP} has no kernel: the suite uses it to make lower() fail")


@opaque_scale.register_fake
def _opaque_scale_shape(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class CallsOpaqueOp(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return opaque_scale(x + 1.0) * 2.0


def opaque_inputs(device: str | torch.device) -> tuple[torch.Tensor, ...]:
    """A fixed example input: a backend that caches compiles by content (the reference keys on the example
    inputs too) then serves a warm run's compile from its cache; random ones cost 25 s per warm run."""
    return (torch.ones(4, 8, device=device),)
