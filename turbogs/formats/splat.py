"""antimatter15's .splat export: 32 bytes a Gaussian (position, scale, RGBA, rotation), colour
only (no SH), which the web viewers of that lineage stream and sort."""

from __future__ import annotations

import numpy as np

from turbogs.fileio import atomic_write_bytes
from turbogs.formats.ply import PathLike, checked_params
from turbogs.gaussians import SH_C0

# antimatter15/splat's record: 32 bytes per Gaussian.
SPLAT_DTYPE = np.dtype([("position", "<f4", 3), ("scale", "<f4", 3), ("rgba", "u1", 4), ("rot", "u1", 4)])


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def splat_records(params) -> np.ndarray:
    """The .splat records (SPLAT_DTYPE), biggest most-opaque Gaussians first, as the
    reference converter orders them so a streaming viewer shows the bulk early."""
    p, _ = checked_params(params)
    log_scales = p["scales"].astype(np.float64)
    opacity = _sigmoid(p["opacities"].astype(np.float64))
    with np.errstate(over="ignore"):
        importance = np.exp(log_scales.sum(axis=1)) * opacity
    order = np.argsort(-importance, kind="stable")

    quats = p["quats"].astype(np.float64)
    quats = quats / np.maximum(np.linalg.norm(quats, axis=1, keepdims=True), 1e-12)
    color = 0.5 + SH_C0 * p["sh0"][:, 0, :].astype(np.float64)
    rgba = np.concatenate([color, opacity[:, None]], axis=1)

    records = np.empty(p["means"].shape[0], dtype=SPLAT_DTYPE)
    records["position"] = p["means"]
    with np.errstate(over="ignore"):
        records["scale"] = np.exp(p["scales"])
    records["rgba"] = np.clip(rgba * 255.0, 0, 255).astype(np.uint8)  # truncates, like the reference
    records["rot"] = np.clip(quats * 128.0 + 128.0, 0, 255).astype(np.uint8)
    return records[order]


def write_splat(path: PathLike, params) -> None:
    """Export the antimatter15 .splat format (web viewers), atomically."""
    atomic_write_bytes(path, splat_records(params).tobytes())
