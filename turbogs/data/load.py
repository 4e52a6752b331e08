"""`load_scene`: the one entry point that turns a capture folder into a `Scene`.

It detects the format, asks the matching reader for a list of views (poses, intrinsics,
image paths), splits them into train and test, then reads every image at the chosen
resolution (in parallel threads; OpenCV releases the GIL), undistorts it if needed, and
turns alpha channels and mask files into per-pixel masks.

Resolution follows INRIA's `-r`: 1, 2, 4 or 8 divide the size (an existing `images_N/`
folder is used as is, otherwise images are downscaled and cached as PNG); a larger
number is a target width; None keeps the full size but caps the width at `max_width`.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import numpy as np
import torch

from turbogs.data import colmap
from turbogs.data.images import (
    DownscaleCache,
    Intrinsics,
    UndistortionCache,
    ViewSpec,
    binarize,
    find_mask,
    has_distortion,
    image_size,
    is_file,
    read_mask,
    read_raw,
    resize,
    split_rgb_alpha,
)
from turbogs.data.scene import Camera, Scene
from turbogs.data.transforms import FrameSet, read_nerf_synthetic, read_nerfstudio, read_ply_points
from turbogs.errors import InputError

RESOLUTION_FACTORS = (1, 2, 4, 8)


@dataclass
class SceneSource:
    """What a reader found, before any pixel is read."""

    views: List[ViewSpec]
    test_views: Optional[List[ViewSpec]] = None  # a fixed test set (NeRF-synthetic), else None
    points: Optional[np.ndarray] = None  # float32 [P, 3]
    colors: Optional[np.ndarray] = None  # float32 [P, 3] in [0, 1]
    frame_sets: List[FrameSet] = field(default_factory=list)  # for the missing-frames warning
    points_source: str = ""
    scene_box: Optional[np.ndarray] = None  # instant-ngp's aabb in world units


def load_scene(
    path: str | Path,
    *,
    resolution: int | None = None,
    images: str = "images",
    eval_split: bool = False,
    white_background: bool = False,
    test_every: int = 8,
    max_width: int = 1600,
    cache_dir: str | Path | None = None,
    log: Callable[[str], None] = print,
) -> Scene:
    """Load a COLMAP, NeRF-synthetic or instant-ngp/nerfstudio capture.

    With `eval_split`, every `test_every`-th view in name order (the first included) is a
    test view, as in INRIA's and gsplat's protocol; NeRF-synthetic uses its own test file.
    """
    scene_dir = Path(path).expanduser()
    if not scene_dir.exists():
        raise InputError(f"scene folder {scene_dir} does not exist")
    if not scene_dir.is_dir():
        raise InputError(f"{scene_dir} is not a folder; expected a scene folder")
    if resolution is not None and (isinstance(resolution, bool) or not isinstance(resolution, int)
                                   or not (resolution in RESOLUTION_FACTORS or resolution > 8)):
        raise InputError(f"resolution must be 1, 2, 4, 8 or a target width above 8, got {resolution!r}")
    if test_every < 1:
        raise InputError(f"test_every must be at least 1, got {test_every}")

    source = _read_source(scene_dir, images, resolution, eval_split, log)
    _warn_missing_frames(source.frame_sets, log)

    names = [view.name for view in source.views + (source.test_views or [])]
    if len(set(names)) != len(names):
        duplicate = next(n for n in names if names.count(n) > 1)
        raise InputError(f"{scene_dir}: image {duplicate!r} is listed more than once")

    train_views, test_views = _split(source, eval_split, test_every)
    if not train_views:
        raise InputError(f"{scene_dir}: no training views left after the test split (test_every={test_every})")

    loader = _ViewLoader(
        resolution=resolution,
        max_width=max_width,
        white_background=white_background,
        cache=DownscaleCache(_cache_folder(scene_dir, cache_dir, images, resolution, max_width), log),
    )
    all_views = train_views + test_views
    workers = max(1, min(8, os.cpu_count() or 1, len(all_views)))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        try:
            loaded = list(pool.map(loader.load, all_views))
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)  # a bad image stops the rest early
            raise
    cameras = [camera for camera, _ in loaded]
    capped = sum(1 for _, was_capped in loaded if was_capped)
    if capped:
        log(
            f"{capped} of {len(cameras)} images are wider than {max_width} px and were downscaled to "
            f"{max_width} px wide; pass resolution 1 (-r 1) to keep the full size"
        )
    return Scene(
        train=cameras[: len(train_views)],
        test=cameras[len(train_views) :],
        points=source.points,
        point_colors=source.colors,
        points_source=source.points_source,
        scene_box=source.scene_box,
        source_path=str(scene_dir),
        white_background=white_background,
    )


# --- format detection and readers ----------------------------------------------------


def _read_source(scene_dir: Path, images: str, resolution, eval_split: bool, log) -> SceneSource:
    model_folder = colmap.find_model_folder(scene_dir)
    if model_folder is not None:
        return _colmap_source(scene_dir, model_folder, images, resolution)
    if (scene_dir / "transforms_train.json").is_file():
        return _nerf_synthetic_source(scene_dir, eval_split, log)
    if (scene_dir / "transforms.json").is_file():
        return _nerfstudio_source(scene_dir, images, log)
    if (scene_dir / "sparse").is_dir():
        raise InputError(f"{scene_dir / 'sparse'}: no COLMAP model (cameras.bin or cameras.txt) in sparse/0/ or sparse/")
    raise InputError(
        f"{scene_dir}: no scene found; looked for sparse/0/ or sparse/ (COLMAP), "
        "transforms_train.json (NeRF-synthetic), transforms.json (instant-ngp/nerfstudio) and photos (for SfM)"
    )


def _colmap_source(scene_dir: Path, model_folder: Path, images: str, resolution) -> SceneSource:
    model = colmap.read_model(model_folder)
    images_dir = scene_dir / images
    masks_dir = images_dir.parent / "masks"
    factor = resolution if resolution in RESOLUTION_FACTORS and resolution > 1 else None
    views = []
    for image in model.images:
        camera = model.cameras[image.camera_id]
        K, dist = colmap.intrinsics(camera)
        fisheye = camera.model in colmap.FISHEYE_MODELS
        view = ViewSpec(
            name=image.name,
            path=images_dir / image.name,
            world_to_cam=colmap.world_to_cam(image),
            intrinsics=Intrinsics(fx=K[0, 0], fy=K[1, 1], cx=K[0, 2], cy=K[1, 2]),
            width=camera.width,
            height=camera.height,
            dist=dist if has_distortion(dist) or fisheye else None,
            fisheye=fisheye,
            folder=images_dir,
            rel=image.name,
            mask_path=find_mask(masks_dir, image.name),
        )
        on_disk = is_file(view.path) or (factor is not None and is_file(view.downscaled_path(factor)))
        if not on_disk:
            if not images_dir.is_dir():
                raise InputError(f"images folder {images_dir} not found (the images option names the folder)")
            raise InputError(f"image {image.name!r} of the COLMAP model {model_folder} is missing from {images_dir}")
        views.append(view)
    points = colors = None
    if model.points is not None and len(model.points):
        points = model.points.astype(np.float32)
        colors = model.colors.astype(np.float32) / 255.0
    source = f"COLMAP {model_folder.relative_to(scene_dir).as_posix()}/points3D"
    return SceneSource(views, points=points, colors=colors, points_source=source)


def _nerf_synthetic_source(scene_dir: Path, eval_split: bool, log) -> SceneSource:
    train = read_nerf_synthetic(scene_dir, "train")
    sets = [train]
    test_views = None
    if eval_split:
        test = read_nerf_synthetic(scene_dir, "test")
        if test is None:
            log(f"{scene_dir}: no transforms_test.json; taking every n-th training view as the test set")
        else:
            sets.append(test)
            test_views = test.views
    return SceneSource(train.views, test_views=test_views, frame_sets=sets)


def _nerfstudio_source(scene_dir: Path, images: str, log) -> SceneSource:
    frames, ply_path = read_nerfstudio(scene_dir, images)
    points = colors = None
    if ply_path is not None:
        if is_file(ply_path):
            points, colors = read_ply_points(ply_path)
        else:
            log(f"{scene_dir / 'transforms.json'}: ply_file_path {ply_path} not found; starting from points along the camera rays")
    return SceneSource(frames.views, points=points, colors=colors, frame_sets=[frames], scene_box=frames.scene_box,
                       points_source=f"{ply_path.name}, named by ply_file_path" if points is not None else "")


def _warn_missing_frames(frame_sets: List[FrameSet], log) -> None:
    """One warning for all frames whose image is missing; an error if none is left."""
    missing = [(s.source, m) for s in frame_sets for m in s.missing]
    found = sum(len(s.views) for s in frame_sets)
    if frame_sets and found == 0:
        first_source, first = missing[0] if missing else (frame_sets[0].source, None)
        raise InputError(f"{first_source}: none of the frames' images were found (first: {first})")
    if missing:
        files = ", ".join(sorted({source.name for source, _ in missing}))
        log(
            f"warning: skipped {len(missing)} frame(s) listed in {files} whose image file is missing "
            f"(first: {missing[0][1]})"
        )


def _split(source: SceneSource, eval_split: bool, test_every: int) -> Tuple[List[ViewSpec], List[ViewSpec]]:
    views = sorted(source.views, key=lambda v: v.name)
    if not eval_split:
        return views, []
    if source.test_views is not None:
        return views, sorted(source.test_views, key=lambda v: v.name)
    test = [v for i, v in enumerate(views) if i % test_every == 0]
    train = [v for i, v in enumerate(views) if i % test_every != 0]
    return train, test


def _cache_folder(scene_dir: Path, cache_dir, images: str, resolution, max_width) -> Path:
    """<cache_dir or scene/.turbogs_cache>/<images>_<N> (or _w<width> for a target width)."""
    root = Path(cache_dir) if cache_dir is not None else scene_dir / ".turbogs_cache"
    images_label = Path(images).name or "images"
    if resolution is None:
        tag = f"{images_label}_w{max_width}"
    elif resolution in RESOLUTION_FACTORS:
        tag = f"{images_label}_{resolution}"
    else:
        tag = f"{images_label}_w{resolution}"
    return root / tag


# --- reading one view ----------------------------------------------------------------


@dataclass
class _ViewLoader:
    resolution: Optional[int]
    max_width: Optional[int]
    white_background: bool
    cache: DownscaleCache
    undistortions: UndistortionCache = field(default_factory=UndistortionCache)

    def target_size(self, width: int, height: int) -> Tuple[Tuple[int, int], bool]:
        """(loaded size, whether the max-width cap decided it) for an original size."""
        r = self.resolution
        if r is None:
            if self.max_width and width > self.max_width:
                return (self.max_width, max(1, round(height * self.max_width / width))), True
            return (width, height), False
        if r in RESOLUTION_FACTORS:
            return (max(1, round(width / r)), max(1, round(height / r))), False
        return (r, max(1, round(height * r / width))), False

    def _read_pixels(self, view: ViewSpec) -> Tuple[np.ndarray, int, int, Path, bool]:
        """(stored pixels at the loaded size, original width, height, file read, capped)."""
        W, H = view.width, view.height
        r = self.resolution
        if r in RESOLUTION_FACTORS and r > 1 and W is not None:
            pre = view.downscaled_path(r)
            if pre is not None and is_file(pre):
                raw = read_raw(pre)
                w, h = image_size(raw)
                if abs(w - W / r) > 1 or abs(h - H / r) > 1:
                    raise InputError(
                        f"image {pre} is {w}x{h} px, but the camera of {view.name!r} is {W}x{H} px, "
                        f"so a 1/{r} copy should be about {W / r:.0f}x{H / r:.0f} px"
                    )
                return raw, W, H, pre, False

        if not is_file(view.path):
            raise InputError(f"image {view.path} not found")
        if W is not None:
            target, capped = self.target_size(W, H)
            if target != (W, H):
                cached = self.cache.get(view.name, view.path, target)
                if cached is not None:
                    return cached, W, H, view.path, capped

        raw = read_raw(view.path)
        w, h = image_size(raw)
        if W is None:
            W, H = w, h
            known_size = False
        elif (w, h) != (W, H):
            raise InputError(f"image {view.path} is {w}x{h} px but its camera says {W}x{H} px")
        else:
            known_size = True
        target, capped = self.target_size(W, H)
        if target != (W, H):
            raw = resize(raw, target)
            if known_size:  # only then can a later run find it without reading the original
                self.cache.put(view.name, raw)
        return raw, W, H, view.path, capped

    def load(self, view: ViewSpec) -> Tuple[Camera, bool]:
        raw, W, H, source, capped = self._read_pixels(view)
        w, h = image_size(raw)
        K = view.intrinsics.matrix(W, H)
        K[0] *= w / W  # fx and cx scale with the width, fy and cy with the height
        K[1] *= h / H
        K[2] = (0.0, 0.0, 1.0)

        rgb, alpha = split_rgb_alpha(raw)
        mask = coverage = None
        if alpha is not None:
            if view.composite_alpha:
                background = 1.0 if self.white_background else 0.0
                rgb = rgb * alpha[:, :, None] + background * (1.0 - alpha[:, :, None])
                coverage = alpha  # kept: training may composite the photo onto other backgrounds
            else:
                mask = binarize(alpha)
        if view.mask_path is not None:
            file_mask = read_mask(view.mask_path)
            mask_size = image_size(file_mask)
            if mask_size not in ((W, H), (w, h)):
                raise InputError(
                    f"mask {view.mask_path} is {mask_size[0]}x{mask_size[1]} px but image {view.name!r} "
                    f"is {W}x{H} px (loaded at {w}x{h})"
                )
            file_mask = binarize(resize(file_mask, (w, h)))
            mask = file_mask if mask is None else mask * file_mask

        if view.fisheye or has_distortion(view.dist):
            dist = view.dist if view.dist is not None else np.zeros(4)
            undistortion = self.undistortions.get(K, dist, (w, h), view.fisheye)
            rgb = undistortion.apply(rgb)
            if mask is not None:
                mask = binarize(undistortion.apply(mask))
            if coverage is not None:
                coverage = undistortion.apply(coverage)
            K = undistortion.K
            w, h = undistortion.size

        if mask is not None and mask.min() > 0:
            mask = None  # every pixel counts: no mask is cheaper downstream
        camera = Camera(
            name=view.name,
            width=w,
            height=h,
            K=torch.from_numpy(np.asarray(K, dtype=np.float32)),
            world_to_cam=torch.from_numpy(np.asarray(view.world_to_cam, dtype=np.float32)),
            image=torch.from_numpy(np.ascontiguousarray(rgb, dtype=np.float32)),
            mask=None if mask is None else torch.from_numpy(np.ascontiguousarray(mask, dtype=np.float32)),
            alpha=None if coverage is None else torch.from_numpy(np.ascontiguousarray(coverage, dtype=np.float32)),
            image_path=str(source),
        )
        return camera, capped
