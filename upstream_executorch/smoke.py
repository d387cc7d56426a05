"""Lower one small two-method model for CUDA with upstream ExecuTorch and print what each stage took.

    python -m upstream_executorch.smoke [--out DIR] [--skip-copies]

Needs a CUDA device and Triton (upstream's CUDA backend imports it). Writes ``model.pte`` and the external
``.ptd`` data to ``--out`` when given; prints one JSON line with sizes and seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn


class SmallBlock(nn.Module):
    """Linear → GELU → a slice (a ``slice_copy`` for upstream's view pass) → Linear."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.nn.functional.gelu(self.up(x))
        return self.down(hidden[:, : hidden.shape[1] // 2])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=None, help="write model.pte and the .ptd files here")
    parser.add_argument("--skip-copies", action="store_true", help="skip_h2d/skip_d2h for method 'decode'")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("smoke: no CUDA device; upstream's CUDA lowering needs one (and Triton)", file=sys.stderr)
        return 2
    from upstream_executorch import BACKEND

    torch.manual_seed(0)
    model = SmallBlock().eval()
    methods = {"prefill": (model, (torch.randn(8, 64),)), "decode": (model, (torch.randn(1, 64),))}
    options = {
        "skip_h2d_for_method_inputs": {"decode": True},
        "skip_d2h_for_method_outputs": {"decode": True},
    }
    start = time.perf_counter()
    lowered = BACKEND.lower_program(  # type: ignore[attr-defined]
        methods, device="cuda", options=options if args.skip_copies else None
    )
    total = time.perf_counter() - start
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "model.pte").write_bytes(lowered.pte)
        for name, data in lowered.data_files.items():
            (args.out / name).write_bytes(data)
    summary = {
        "executorch": BACKEND.version,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0),
        "methods": list(lowered.methods),
        "skip_copies": args.skip_copies,
        "pte_bytes": len(lowered.pte),
        "data_files": {name: len(data) for name, data in lowered.data_files.items()},
        "seconds": {"total": round(total, 2), **{k: round(v, 2) for k, v in lowered.seconds.items()}},
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
