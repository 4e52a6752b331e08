"""`python -m turbogs.viewer MODEL [--host H] [--port P]`: serve a model without the CLI."""

from __future__ import annotations

import argparse
import sys

from turbogs.errors import TurboGSError

from .saved_model import serve_model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m turbogs.viewer", description=__doc__)
    parser.add_argument("model", help="model folder (point_cloud/iteration_N/point_cloud.ply) or a .ply file")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (0.0.0.0 exposes the model to the network)")
    parser.add_argument("--port", type=int, default=8080, help="first port to try; the next free one is used if taken")
    parser.add_argument("--viewer-control", action="store_true",
                        help="off loopback, let every browser save screenshots here too (read-only otherwise)")
    args = parser.parse_args(argv)
    try:
        serve_model(args.model, host=args.host, port=args.port, block=True, log=lambda msg: print(msg, flush=True),
                    control=args.viewer_control)
    except TurboGSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
