"""COLMAP models written in COLMAP's own binary and text layouts (without 2D points or tracks),
for tests and tools that need small models and broken ones. TurboGS itself only reads COLMAP
(SfM writes its models through pycolmap), so the writer lives here, beside the tests.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import List

import numpy as np

from turbogs.data.colmap import MODEL_IDS, ColmapCamera, ColmapImage


def write_model(folder: Path, cameras: List[ColmapCamera], images: List[ColmapImage], points: np.ndarray, colors: np.ndarray, binary: bool = True) -> None:
    """Write a model in COLMAP's own binary or text layout (without 2D points or tracks)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if binary:
        out = [struct.pack("<Q", len(cameras))]
        for c in cameras:
            out.append(struct.pack("<iiQQ", c.camera_id, MODEL_IDS[c.model], c.width, c.height))
            out.append(struct.pack(f"<{len(c.params)}d", *c.params))
        (folder / "cameras.bin").write_bytes(b"".join(out))
        out = [struct.pack("<Q", len(images))]
        for im in images:
            out.append(struct.pack("<i4d3di", im.image_id, *im.qvec, *im.tvec, im.camera_id))
            out.append(im.name.encode("utf-8") + b"\x00")
            out.append(struct.pack("<Q", 0))
        (folder / "images.bin").write_bytes(b"".join(out))
        out = [struct.pack("<Q", len(points))]
        for i, (p, c) in enumerate(zip(points, colors)):
            out.append(struct.pack("<Q3d3BdQ", i + 1, *p, *(int(v) for v in c), 0.5, 0))
        (folder / "points3D.bin").write_bytes(b"".join(out))
    else:
        lines = ["# Camera list with one line of data per camera:"]
        for c in cameras:
            lines.append(" ".join([str(c.camera_id), c.model, str(c.width), str(c.height)] + [repr(float(v)) for v in c.params]))
        (folder / "cameras.txt").write_text("\n".join(lines) + "\n")
        lines = ["# Image list with two lines of data per image:"]
        for im in images:
            values = [repr(float(v)) for v in (*im.qvec, *im.tvec)]
            lines.append(" ".join([str(im.image_id)] + values + [str(im.camera_id), im.name]))
            lines.append("")
        (folder / "images.txt").write_text("\n".join(lines) + "\n")
        lines = ["# 3D point list with one line of data per point:"]
        for i, (p, c) in enumerate(zip(points, colors)):
            lines.append(" ".join([str(i + 1)] + [repr(float(v)) for v in p] + [str(int(v)) for v in c] + ["0.5"]))
        (folder / "points3D.txt").write_text("\n".join(lines) + "\n")
