"""Video in: the sharpest frame of each of N equal windows of the clip, as photos for SfM.

Frames are decoded once, in order, by the ffmpeg that imageio-ffmpeg ships (any codec a phone
writes). The clip is cut into N windows of equal time, and each keeps the frame with the highest
variance of the Laplacian (the usual focus measure: motion blur and defocus flatten edges, which
lowers it). Sharp frames give SIFT more to match; equal windows keep the frames spread along the
path, in order, for sequential matching.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, List, Optional

import cv2
import numpy as np

from turbogs.capture.photos import MIN_PHOTOS
from turbogs.errors import InputError
from turbogs.fileio import atomic_path

INSTALL = 'pip install -e ".[capture]" (or pip install imageio-ffmpeg)'
DEFAULT_FRAMES = 100
FRAME_PATTERN = "frame_{:04d}.jpg"
JPEG_QUALITY = 95


def sharpness(rgb: np.ndarray) -> float:
    """Variance of the Laplacian of the grey image."""
    grey = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    return float(cv2.Laplacian(grey, cv2.CV_64F).var())


def _open(video: Path):
    try:
        import imageio_ffmpeg
    except ImportError:
        raise InputError(f"reading a video needs imageio-ffmpeg, which is not installed: {INSTALL}") from None
    if not video.is_file():
        raise InputError(f"video {video} does not exist")
    reader = imageio_ffmpeg.read_frames(str(video))
    try:
        meta = next(reader)
    except (RuntimeError, OSError, StopIteration) as exc:
        reader.close()
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise InputError(f"cannot read video {video}: not a video ffmpeg can decode ({first[:160]})") from None
    return reader, meta


def extract_frames(video: Path, out_dir: Path, count: int = DEFAULT_FRAMES, progress: bool = True,
                   log: Callable[[str], None] = print) -> List[Path]:
    """Write the sharpest frame of each of `count` windows to out_dir/frame_NNNN.jpg; their paths."""
    from tqdm import tqdm

    video = Path(video)
    reader, meta = _open(video)
    width, height = meta["size"]
    fps = float(meta.get("fps") or 0) or 30.0
    duration = float(meta.get("duration") or 0)
    expected = max(1, round(duration * fps)) if duration > 0 else None
    best: List[Optional[tuple]] = [None] * count  # (sharpness, frame index, pixels) per window
    decoded = 0
    try:
        with tqdm(total=expected, desc="frames", unit="frame", disable=not progress) as bar:
            for raw in reader:
                frame = np.frombuffer(raw, np.uint8).reshape(height, width, 3)
                window = min(count - 1, decoded * count // expected) if expected else decoded % count
                score = sharpness(frame)
                if best[window] is None or score > best[window][0]:
                    best[window] = (score, decoded, frame.copy())
                decoded += 1
                bar.update(1)
    except RuntimeError as exc:
        raise InputError(f"cannot read video {video}: decoding stopped after {decoded} frames ({exc})") from None
    finally:
        reader.close()
    kept = sorted((entry for entry in best if entry is not None), key=lambda entry: entry[1])
    if len(kept) < MIN_PHOTOS:
        raise InputError(f"video {video} has {decoded} frame{'s' if decoded != 1 else ''}; structure from motion needs "
                         f"at least {MIN_PHOTOS} (a clip of a few seconds, moving around the subject)")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, (_, _, frame) in enumerate(kept):
        path = out_dir / FRAME_PATTERN.format(index)
        with atomic_path(path) as tmp:
            if not cv2.imwrite(str(tmp), cv2.cvtColor(frame, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY]):
                raise OSError(f"could not write {path}")
        paths.append(path)
    log(f"video {video.name}: {decoded} frames, kept the sharpest of each of {len(kept)} windows in {out_dir}")
    return paths
