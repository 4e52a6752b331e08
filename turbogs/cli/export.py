"""`turbogs export MODEL -o FILE`: a model as .ply (INRIA), .splat, .spz (Niantic) or .sog (PlayCanvas)."""

from __future__ import annotations

import argparse
from pathlib import Path

from turbogs.errors import TurboGSError


def add_parser(subcommands) -> None:
    p = subcommands.add_parser("export", help="export a model as .ply (INRIA), .splat, .spz (Niantic) or .sog (PlayCanvas)")
    p.add_argument("model", help="model folder, or a .ply, .spz or .sog file")
    p.add_argument("--format", help="ply, splat, spz or sog (default: the -o file's extension)")
    p.add_argument("--output", "-o", required=True, help="file to write")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from turbogs.formats import FORMATS, format_of, write_gaussians
    from turbogs.formats.model_folder import load_model, model_antialiased, model_folder_of

    out = Path(args.output)
    fmt = args.format or format_of(out)
    if fmt not in FORMATS:
        raise TurboGSError(f"unknown format '{fmt or out.suffix}' (choose --format from {', '.join(FORMATS)})")
    if format_of(out) != fmt:
        raise TurboGSError(f"-o {out}: the extension does not match --format {fmt}; name it *.{fmt}")
    if out.is_dir():
        raise TurboGSError(f"{out}: is a folder; -o takes a file name")
    if not out.parent.is_dir():
        raise TurboGSError(f"{out.parent}: no such folder")
    import torch

    model = Path(args.model)
    params, sh_degree, _ = load_model(model)
    antialiased = model_antialiased(model if model.is_dir() else model_folder_of(model))
    write_gaussians(out, fmt, params, device="cuda" if torch.cuda.is_available() else "cpu",  # .sog's k-means
                    antialiased=antialiased)
    if antialiased and fmt != "spz":
        print(f"note: the model was trained with --antialiased, which .{fmt} cannot record: a classic renderer "
              "shows it without the opacity compensation (sub-pixel splats a little denser; .spz keeps the flag)")
    print(f"wrote {out} ({len(params['means'])} Gaussians, {fmt}, {out.stat().st_size} bytes"
          f"{', SH DC colors only' if fmt == 'splat' else f', SH degree {sh_degree}'})")
    return 0
