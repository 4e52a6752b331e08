"""Argument types and shared flags of the `turbogs` command line.

Separate from cli.py so that subcommands living in their own packages (bench) can use
them without importing the command line that imports them.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import List

from turbogs.errors import TurboGSError
from turbogs.host_memory import keep_freed_memory


def resolution_arg(text: str) -> int:
    """1, 2, 4 or 8 (a downscale factor, as INRIA's -r), or a target width of 16 px or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if value in (1, 2, 4, 8) or value >= 16:
        return value
    raise argparse.ArgumentTypeError(f"{value} is neither a downscale factor (1, 2, 4, 8) nor a width (16 px or more)")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be positive")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{value} must be a positive number")
    return value


def port_arg(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (1-65535)")
    return value


def pick_device(name: str, threads: int = 1):
    """The torch device for --device, and the CPU thread count: on CPU this workload is many
    small ops, which run several times faster on one thread than fighting over two."""
    import torch

    torch.set_num_threads(threads)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise TurboGSError("--device cuda: no CUDA GPU is visible to torch (is this a CPU build of torch?)")
    if name == "cpu":  # the CPU path's tensors come from malloc: keep them from page-faulting (host_memory.py)
        keep_freed_memory()
    return torch.device(name)


def add_torch_twins(p: argparse.ArgumentParser) -> None:
    p.add_argument("--torch-twins", action="store_true",
                   help="on CUDA, run TurboGS's own ops (error memory, sampling, tile loss) as their torch twins "
                        "instead of the turbogs._C kernels: slower, for debugging a kernel. Without it, kernels "
                        "that cannot be built are an error")


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where to compute: cuda uses gsplat's kernels, cpu the torch twins (default: auto)")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="CPU threads for torch (default 1: the many small ops of the CPU path run fastest on one)")


def run_command(parser: argparse.ArgumentParser, argv: List[str]) -> int:
    """Parse `argv` and run the chosen command: a TurboGSError becomes one line on stderr and
    its exit code (2), Ctrl-C exit code 130. argparse itself exits 2 with one line on a bad flag."""
    args = parser.parse_args(argv)
    args.argv = argv  # the command as typed, for the records benchmarks keep
    try:
        return args.func(args)
    except TurboGSError as exc:
        if not getattr(exc, "quiet", False):  # a rank > 0 stopping for a reason rank 0 reports
            print(f"turbogs {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"turbogs {args.command}: interrupted", file=sys.stderr)
        return 130
