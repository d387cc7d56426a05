"""AOTInductor packages a model calling an op that has no kernel at all; the failure comes at run time.

    python torch_aoti/repros/kernel_less_op.py [--device cuda]

Defines a custom op with only a fake (shape) implementation, exports a model calling it and packages it with
``aoti_compile_and_package``: no error (the op becomes a proxy-executor fallback call). Loading works too;
only running the model fails, inside the op. Exits 0 when the package is built and only the run fails; 1
otherwise (PyTorch changed: update the known failure). ``--device cuda``: the same for a model exported
with a CUDA example input, called with a CUDA input (synchronised inside the ``try``).
"""

from __future__ import annotations

import os
import tempfile

import torch
from _add_mul import arguments, cuda_missing, device_fault  # this directory: the script's own


@torch.library.custom_op("torch_aoti_repro::no_kernel", mutates_args=())
def no_kernel(x: torch.Tensor) -> torch.Tensor:
    raise NotImplementedError("torch_aoti_repro::no_kernel has no kernel on any device")


@no_kernel.register_fake
def _shape(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class CallsIt(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return no_kernel(x + 1.0) * 2.0


def main() -> int:
    device = arguments(__doc__, child=False).device
    if cuda_missing(device):
        return 0
    print(f"device {device}, torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            ep = torch.export.export(CallsIt(), (torch.ones(4, 8, device=device),))
            path = torch._inductor.aoti_compile_and_package(ep, package_path=os.path.join(tmp, "op.pt2"))
        except Exception as exc:
            print(f"lowering refused it: {type(exc).__name__}: {exc}")
            print("NOT reproduced: PyTorch's behaviour changed")
            return 1
        print(f"lowered: a {os.path.getsize(path)}-byte package for a model no device can run")
        model = torch._inductor.aoti_load_package(path)
        print("loaded")
        try:
            model(torch.ones(4, 8, device=device))
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:
            print(f"the run fails: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
            if device_fault(exc):  # a CUDA error is not the op's missing kernel
                print("NOT reproduced: the run failed with a CUDA error")
                return 1
            print("reproduced")
            return 0
    print("NOT reproduced: the model ran")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
