"""`turbogs` command line: train | sfm | eval | render | export | view | bench.

One module per subcommand, each with `add_parser(subcommands)` (its flags) and `run(args)`;
shared argument types and flags are in args.py. Every user-facing problem is a TurboGSError:
printed as one line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from turbogs.cli import bench, evaluate, export, render, sfm, train, view
from turbogs.cli.args import run_command

SUBCOMMANDS = (train, sfm, evaluate, render, export, view, bench)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="turbogs", description="Train and look at 3D Gaussian Splatting scenes, fast.")
    subcommands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in SUBCOMMANDS:
        command.add_parser(subcommands)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    code = run_command(build_parser(), list(sys.argv[1:] if argv is None else argv))
    if argv is None:  # the process's own command: a rank of several ends past the C++ teardown
        from turbogs.distributed.world import exit_rank, launched_by_torchrun

        if launched_by_torchrun():
            exit_rank(code)
    return code
