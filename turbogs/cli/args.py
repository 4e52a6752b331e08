"""Argument types and flags that several subcommands share, and how a command runs: a
TurboGSError becomes one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import math
import sys
from typing import List

from turbogs.errors import TurboGSError

DEFAULT_PORT = 8080


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


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None


def positive_float(text: str) -> float:
    value = _number(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{value} must be a positive number")
    return value


def share_arg(text: str) -> float:
    """A share: a finite number >= 0."""
    value = _number(text)
    if not (value >= 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{value} must be 0 or more")
    return value


def port_arg(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (1-65535)")
    return value


def add_torch_twins(p: argparse.ArgumentParser) -> None:
    p.add_argument("--torch-twins", action="store_true",
                   help="run TurboGS's own ops as their torch twins: on CUDA the error memory, sampling and tile "
                        "loss instead of the turbogs._C kernels, on the CPU the projection, SH, tile intersection, "
                        "compositing and tile loss instead of the native C++ kernels. Slower: to debug a kernel or "
                        "time both paths. Without it, CUDA kernels that "
                        "cannot be built are an error (a CPU build that fails falls back to the twins, one line)")


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where to compute: cuda uses gsplat's kernels, cpu our C++ kernels and the torch twins "
                        "(default: auto)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="CPU threads for torch, for the whole run (default: $OMP_NUM_THREADS if set, else every "
                        "core; the ranks of --nproc share them). The CPU kernels' results do not depend on it; on "
                        "a machine other processes keep busy, fewer threads than busy cores run faster")


def add_server(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1, this machine only; 0.0.0.0 exposes it to the network)")
    p.add_argument("--port", type=port_arg, default=DEFAULT_PORT,
                   help=f"port of the web viewer (default {DEFAULT_PORT}; the next free one if taken)")
    p.add_argument("--viewer-control", action="store_true",
                   help="off loopback, let every browser that reaches the viewer use its controls (pause/resume/stop "
                        "training, screenshots); without it such a viewer is read-only. On loopback they always work")


def run_command(parser: argparse.ArgumentParser, argv: List[str]) -> int:
    """Parse `argv` and run the chosen command: a TurboGSError becomes one line on stderr and
    its exit code (2), Ctrl-C exit code 130 (a second signal while `train` saves a stopped run
    says so, with 128 + the signal's number). argparse itself exits 2 with one line on a bad flag."""
    args = parser.parse_args(argv)
    args.argv = argv  # the command as typed, for the records benchmarks keep
    try:
        return args.func(args)
    except TurboGSError as exc:
        if not getattr(exc, "quiet", False):  # a rank > 0 stopping for a reason rank 0 reports
            print(f"turbogs {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        print(f"turbogs {args.command}: {exc or 'interrupted'}", file=sys.stderr)
        return getattr(exc, "exit_code", 130)
