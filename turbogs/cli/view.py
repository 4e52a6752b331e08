"""`turbogs view MODEL`: look at a model (folder, .ply, .spz or .sog) in the browser."""

from __future__ import annotations

import argparse

from turbogs.cli.args import add_server


def add_parser(subcommands) -> None:
    p = subcommands.add_parser("view", help="look at a model in the browser")
    p.add_argument("model", help="model folder, or a .ply file")
    add_server(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from turbogs.viewer import serve_model

    serve_model(args.model, host=args.host, port=args.port, block=True, control=args.viewer_control)
    return 0
