"""MP4 encoding: H.264 (yuv420p) through imageio-ffmpeg, the video browsers play.

Why imageio-ffmpeg: its wheel ships an ffmpeg binary with libx264, while the opencv-python(-headless)
wheels can only write MPEG-4 Part 2 ('mp4v'), which Chrome, Firefox and Safari refuse to play.
yuv420p is the one chroma layout every H.264 decoder (and so every browser) takes; `+faststart`
puts the index at the front so a page can start playing before the file is fully loaded.

imageio-ffmpeg is in the optional `capture` extra (its wheel is 68 MB). Without it the video is
still written, as 'mp4v' through OpenCV, and `open_mp4` says so, naming the pip command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Tuple

import cv2
import numpy as np

from turbogs.errors import TurboGSError

H264_INSTALL = 'pip install imageio-ffmpeg (or pip install -e ".[capture]")'
CRF = 18  # x264's constant quality: 18 is visually lossless for renders, and small at these sizes


class H264Writer:
    """Frames (uint8 RGB [H, W, 3]) into an H.264 MP4 through imageio-ffmpeg's ffmpeg."""

    codec = "h264"

    def __init__(self, path: Path, size: Tuple[int, int], fps: float):
        import imageio_ffmpeg

        self.size = size
        self._frames = imageio_ffmpeg.write_frames(
            str(path), size, fps=fps, codec="libx264", pix_fmt_in="rgb24", pix_fmt_out="yuv420p",
            quality=None, macro_block_size=1, ffmpeg_log_level="error",
            output_params=["-crf", str(CRF), "-movflags", "+faststart"])
        try:
            self._frames.send(None)  # starts ffmpeg
        except (OSError, RuntimeError) as exc:
            raise TurboGSError(f"cannot write {path}: ffmpeg did not start ({exc})") from None

    def write(self, rgb: np.ndarray) -> None:
        try:
            self._frames.send(np.ascontiguousarray(rgb, dtype=np.uint8))
        except (OSError, RuntimeError) as exc:  # ffmpeg died (disk full, killed)
            raise TurboGSError(f"the H.264 encoder stopped: {exc}") from None

    def close(self) -> None:
        try:
            self._frames.close()
        except (OSError, RuntimeError) as exc:
            raise TurboGSError(f"the H.264 encoder failed at the end of the video: {exc}") from None


class Mp4vWriter:
    """The fallback: MPEG-4 Part 2 through OpenCV's VideoWriter (plays in VLC, not in browsers)."""

    codec = "mp4v"

    def __init__(self, path: Path, size: Tuple[int, int], fps: float):
        self._writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, size)
        if not self._writer.isOpened():
            raise TurboGSError(f"cannot write {path}: OpenCV's VideoWriter has no 'mp4v' MP4 encoder here")

    def write(self, rgb: np.ndarray) -> None:
        self._writer.write(np.ascontiguousarray(rgb[:, :, ::-1]))

    def close(self) -> None:
        self._writer.release()


def h264_available() -> bool:
    try:
        import imageio_ffmpeg  # noqa: F401
    except ImportError:
        return False
    return True


def open_mp4(path: Path, size: Tuple[int, int], fps: float, log: Callable[[str], None] = print):
    """An H.264 writer, or where imageio-ffmpeg is missing the mp4v one, after one line that says so.
    `size` is (width, height), both even (yuv420p halves the chroma in each direction)."""
    if size[0] % 2 or size[1] % 2:
        raise TurboGSError(f"an MP4 frame needs an even width and height, got {size[0]}x{size[1]}")
    if h264_available():
        return H264Writer(path, size, fps)
    log(f"imageio-ffmpeg is not installed: writing MPEG-4 Part 2 ('mp4v'), which browsers do not play; "
        f"for H.264: {H264_INSTALL}")
    return Mp4vWriter(path, size, fps)
