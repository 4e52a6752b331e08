"""Gaussian model files by format: one module per format, one table that names them all.

    ply    INRIA's .ply (formats.ply): full precision, every SH band; SIBR, SuperSplat, most viewers
    splat  antimatter15's .splat (formats.splat): 32 bytes a Gaussian, colour only, no SH
    spz    Niantic's .spz v3 (formats.spz): gzip, fixed-point and 8-bit planes, ~10x smaller than .ply
    sog    PlayCanvas's SOG v2 (formats.sog): WebP textures + meta.json in one zip, k-means codebooks

`read_gaussians` opens .ply, .spz and .sog (what `view`, `eval` and `render` load);
`write_gaussians` writes all four.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Tuple

import numpy as np

from turbogs.errors import InputError

FORMATS = ("ply", "splat", "spz", "sog")
READABLE_SUFFIXES = (".ply", ".spz", ".sog")


def format_of(path) -> str:
    """The format a file name's extension names, or '' when it names none of ours."""
    suffix = Path(path).suffix.lower().lstrip(".")
    return suffix if suffix in FORMATS else ""


def read_gaussians(path) -> Tuple[Dict[str, np.ndarray], int]:
    """(pre-activation float32 params, SH degree) of a .ply, .spz or .sog file."""
    fmt = format_of(path)
    if fmt == "ply":
        from turbogs.formats.ply import read_ply

        return read_ply(path)
    if fmt == "spz":
        from turbogs.formats.spz import read_spz

        return read_spz(path)
    if fmt == "sog":
        from turbogs.formats.sog import read_sog

        return read_sog(path)
    raise InputError(f"{path}: cannot read a '{Path(path).suffix}' file as a model (use .ply, .spz or .sog)")


def write_gaussians(path, fmt: str, params: Dict[str, np.ndarray], device: str = "cpu", antialiased: bool = False) -> None:
    """Write `params` as `fmt`, atomically. The caller has checked the format and the path.
    `antialiased` (a model trained with --antialiased) is recorded where the format has a
    place for it: .spz's header flag; .ply, .splat and .sog have none (see the README)."""
    if fmt == "ply":
        from turbogs.formats.ply import write_ply as write
    elif fmt == "splat":
        from turbogs.formats.splat import write_splat as write
    elif fmt == "spz":
        from turbogs.formats.spz import write_spz

        return write_spz(path, params, antialiased=antialiased)
    elif fmt == "sog":
        from turbogs.formats.sog import write_sog

        return write_sog(path, params, device=device)
    else:
        raise InputError(f"unknown format '{fmt}' (choose from {', '.join(FORMATS)})")
    write(path, params)
