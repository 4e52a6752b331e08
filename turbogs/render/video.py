"""Fly-through videos: render a camera path (turbogs.render.camera_paths) to MP4 and/or PNG frames.

The training cameras come from the model's cameras.json (INRIA layout: camera-to-world
rotation and position, fx, fy, width, height), so a video needs no training images. The frames
use the first training camera's field of view, at --width pixels (even sizes: most MP4
decoders need them).

The MP4 is H.264 (yuv420p) through imageio-ffmpeg, or 'mp4v' through OpenCV where that is not
installed (turbogs.render.mp4). It is written to a temporary name and renamed when the last frame
is in, so an interrupted render never leaves a half video under the real name.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import numpy as np
import torch

from turbogs.data.scene import Camera
from turbogs.errors import InputError
from turbogs.fileio import atomic_path
from turbogs.render.mp4 import open_mp4


@dataclass
class Intrinsics:
    width: int
    height: int
    fx: float
    fy: float

    def scaled_to(self, width: Optional[int]) -> "Intrinsics":
        """Same field of view at `width` px (rounded to even sizes)."""
        scale = (width or self.width) / self.width
        w = max(2, int(round(self.width * scale / 2)) * 2)
        h = max(2, int(round(self.height * scale / 2)) * 2)
        return Intrinsics(w, h, self.fx * w / self.width, self.fy * h / self.height)


def cameras_json_for(model: Path) -> Optional[Path]:
    """cameras.json of a model folder, beside a model file, or of the folder holding
    MODEL/point_cloud/iteration_N/point_cloud.ply."""
    model = Path(model)
    folders = [model] if model.is_dir() else [model.parent, model.parent.parent.parent]
    return next((f / "cameras.json" for f in folders if (f / "cameras.json").is_file()), None)


def read_training_poses(path: Path):
    """(camera-to-world poses [K, 4, 4] in name order, Intrinsics of the first) from cameras.json."""
    try:
        entries = json.loads(Path(path).read_text())
        entries = sorted(entries, key=lambda e: str(e.get("img_name", "")))
        poses = np.tile(np.eye(4), (len(entries), 1, 1))
        for pose, e in zip(poses, entries):
            pose[:3, :3] = np.asarray(e["rotation"], np.float64)
            pose[:3, 3] = np.asarray(e["position"], np.float64)
        first = entries[0] if entries else None
        intrinsics = Intrinsics(int(first["width"]), int(first["height"]), float(first["fx"]), float(first["fy"])) \
            if first else None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{path}: unreadable cameras.json ({type(exc).__name__}: {exc})") from None
    if not np.isfinite(poses).all():
        raise InputError(f"{path}: a camera pose is not finite")
    return poses, intrinsics


def poses_from_cameras(cameras: List[Camera]):
    """The same, from a loaded scene's cameras (for `--source SCENE`)."""
    cameras = sorted(cameras, key=lambda c: c.name)
    poses = np.stack([np.linalg.inv(c.world_to_cam.double().numpy()) for c in cameras]) if cameras else np.zeros((0, 4, 4))
    first = cameras[0] if cameras else None
    intrinsics = Intrinsics(first.width, first.height, float(first.K[0, 0]), float(first.K[1, 1])) if first else None
    return poses, intrinsics


def camera_at(pose: np.ndarray, intrinsics: Intrinsics, name: str) -> Camera:
    k = torch.tensor([[intrinsics.fx, 0, intrinsics.width / 2], [0, intrinsics.fy, intrinsics.height / 2], [0, 0, 1]],
                     dtype=torch.float32)
    world_to_cam = torch.from_numpy(np.linalg.inv(pose)).float()
    return Camera(name=name, width=intrinsics.width, height=intrinsics.height, K=k, world_to_cam=world_to_cam)


def path_cameras(model: Path, kind: str, frames: int, width: Optional[int], scene=None) -> List[Camera]:
    """The cameras of a `kind` path (turbogs.render.camera_paths) around the model's training cameras:
    those of `scene` when given (--source), else the model's cameras.json."""
    from turbogs.render.camera_paths import camera_path

    if scene is not None:
        poses, intrinsics = poses_from_cameras(scene.train)
    else:
        path = cameras_json_for(model)
        if path is None:
            raise InputError(f"{model}: no cameras.json beside the model to build a camera path from; "
                             "pass --source SCENE (the capture it was trained on)")
        poses, intrinsics = read_training_poses(path)
    if intrinsics is None:
        raise InputError(f"{model}: the model has no training cameras to build a camera path from")
    intrinsics = intrinsics.scaled_to(width)
    return [camera_at(pose, intrinsics, f"{kind}_{i:04d}") for i, pose in enumerate(camera_path(kind, poses, frames))]


def render_path(gaussians, cameras: List[Camera], background: torch.Tensor, video: Optional[Path],
                fps: float, frames_dir: Optional[Path], progress: bool = True, log=print) -> str:
    """Render every camera; stream the frames into `video` (MP4) and/or PNGs in `frames_dir`.
    Returns the video's codec ('h264' or 'mp4v'), or '' without a video."""
    from tqdm import tqdm

    from turbogs.render import render
    from turbogs.render.png import to_uint8, write_png

    if frames_dir is not None:
        frames_dir.mkdir(parents=True, exist_ok=True)
    width, height = cameras[0].width, cameras[0].height
    with atomic_path(video) if video is not None else nullcontext() as tmp:
        writer = open_mp4(tmp, (width, height), fps, log) if tmp is not None else None
        try:
            bar = tqdm(cameras, desc="render", unit="frame", disable=not progress)
            for index, camera in enumerate(bar):
                with torch.no_grad():
                    image = render(gaussians, camera, background=background).image
                if writer is not None:
                    writer.write(to_uint8(image)[:, :, ::-1])  # to_uint8 gives OpenCV's BGR
                if frames_dir is not None:
                    write_png(frames_dir / f"frame_{index:04d}.png", image)
                bar.set_postfix(size=f"{width}x{height}")
        finally:
            if writer is not None:
                writer.close()
    return writer.codec if writer is not None else ""

