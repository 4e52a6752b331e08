"""Generate small test captures in the formats users bring, with an independent renderer.

The images come from `make_demo.py`'s analytic numpy ray caster (never from our
rasterizer), so a trainer that scores well on them has learned the scene, not its own
renderer. Five captures, each a few hundred kB:

- `forward`: instant-ngp `transforms.json`, 24 cameras on an arc on ONE side of the
  demo objects (azimuth -50..50 degrees, their aim jittered so the optical axes do not
  meet in one point), `aabb_scale` 4, no point cloud. Trained from it, the old
  random-in-the-cameras'-box initialisation puts every point in a slab around the
  cameras, in front of nothing.
- `forward_points`: the same views plus SfM-like points in `points3d.ply`, named by
  nerfstudio's `ply_file_path` (surface points seen by at least two cameras, with
  position and colour noise).
- `exposure`: the same views with a different exposure (x 2^U(-0.6, 0.6)) and white
  balance (per-channel gains 0.8..1.2) per photo, test views included, with the points.
- `masks`: the forward views with the points, and in every training photo (not the test
  views, every 8th) a passer-by: a sphere of a random colour between the camera and the
  objects, somewhere else in each photo. `masks/frame_NNN.png` (white = keep) masks out
  every pixel the passer-by changed, its shadow included, grown by a pixel; the loader finds
  them beside `images/`. A trainer that ignores the masks grows floaters.
- `synthetic`: NeRF-synthetic layout: the objects alone, centred on the origin, on a
  transparent background (RGBA), 20 training and 5 test cameras on a sphere of radius 4
  looking at the origin, `transforms_train.json` / `transforms_test.json`, no points.

Run `python scenes/make_captures.py --out DIR [NAME ...]`; deterministic (fixed seeds).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time
from typing import Dict, List

import cv2
import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("make_demo", os.path.join(_HERE, "make_demo.py"))
demo = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("make_demo", demo)
_spec.loader.exec_module(demo)

WIDTH, HEIGHT = 96, 72
FOCAL = 86.0  # the demo's field of view (about 58 degrees horizontal)
SUPERSAMPLE = 2
FORWARD_VIEWS = 24
ARC_DEGREES = (-50.0, 50.0)  # azimuths of the arc, around the side facing -y
ARC_RADIUS = 3.7
ARC_ELEVATION_DEG = (12.0, 30.0)
AIM_JITTER = 0.25  # world units: each camera aims near LOOK_AT, not exactly at it
AABB_SCALE = 4  # instant-ngp: a box of 4 / 0.33 units around the origin (default scale/offset)
NUM_POINTS = 2000
SYNTHETIC_SIZE = 80
SYNTHETIC_ANGLE_X = 0.6911112070083618  # the Blender scenes' camera_angle_x
SYNTHETIC_RADIUS = 4.0
SYNTHETIC_TRAIN, SYNTHETIC_TEST = 20, 5
GL_TO_CV = np.diag([1.0, -1.0, -1.0, 1.0])
CAPTURES = ("forward", "forward_points", "exposure", "masks", "synthetic")
TEST_EVERY = 8  # the loader's --eval split: every 8th image in name order is a test view
PASSER_BY_RADIUS = 0.3


def intrinsics(width: int, height: int, focal: float) -> np.ndarray:
    return np.array([[focal, 0.0, width / 2.0], [0.0, focal, height / 2.0], [0.0, 0.0, 1.0]])


def render(primitives, w2c: np.ndarray, K: np.ndarray, width: int, height: int, background=None):
    """[H, W, 3] colour and [H, W] coverage, SUPERSAMPLE^2 rays per pixel. With
    `background` None the demo's sky fills misses; otherwise coverage says how much of
    each pixel the objects cover (the alpha of a NeRF-synthetic image)."""
    sub = (np.arange(SUPERSAMPLE) + 0.5) / SUPERSAMPLE
    jj, ii, sj, si = np.meshgrid(np.arange(height), np.arange(width), sub, sub, indexing="ij")
    origins, dirs = demo.pixel_rays(w2c, K, (ii + si).ravel().astype(np.float64), (jj + sj).ravel().astype(np.float64))
    colors = demo.trace(primitives, origins, dirs)
    _, prim_ids = demo.cast(primitives, origins, dirs)
    hit = (prim_ids >= 0).astype(np.float64)
    if background is not None:
        colors[prim_ids < 0] = background
    n = SUPERSAMPLE * SUPERSAMPLE
    return colors.reshape(height, width, n, 3).mean(axis=2), hit.reshape(height, width, n).mean(axis=2)


def arc_poses(rng: np.random.Generator) -> List[np.ndarray]:
    """World-to-camera poses on an arc in front of the objects (the -y side)."""
    poses = []
    low, high = np.radians(ARC_DEGREES)
    for k in range(FORWARD_VIEWS):
        s = k / (FORWARD_VIEWS - 1)
        azimuth = -math.pi / 2 + low + (high - low) * s
        elevation = math.radians(ARC_ELEVATION_DEG[0] + (ARC_ELEVATION_DEG[1] - ARC_ELEVATION_DEG[0]) * (0.5 + 0.5 * math.sin(5 * s)))
        center = demo.LOOK_AT + ARC_RADIUS * np.array(
            [math.cos(elevation) * math.cos(azimuth), math.cos(elevation) * math.sin(azimuth), math.sin(elevation)])
        target = demo.LOOK_AT + rng.uniform(-AIM_JITTER, AIM_JITTER, 3)
        poses.append(demo.look_at(center, target))
    return poses


def sphere_poses(count: int, rng: np.random.Generator) -> List[np.ndarray]:
    """Cameras at SYNTHETIC_RADIUS from the origin, looking at it, from elevation -20..75 deg."""
    poses = []
    for _ in range(count):
        azimuth = rng.uniform(0, 2 * math.pi)
        elevation = math.asin(rng.uniform(math.sin(math.radians(-20)), math.sin(math.radians(75))))
        center = SYNTHETIC_RADIUS * np.array(
            [math.cos(elevation) * math.cos(azimuth), math.cos(elevation) * math.sin(azimuth), math.sin(elevation)])
        poses.append(demo.look_at(center, np.zeros(3)))
    return poses


def surface_points(primitives, poses, K, width, height, rng) -> tuple:
    """SfM-like points: hits of random pixel rays seen (in frame, unoccluded) by >= 2 cameras."""
    candidates = NUM_POINTS * 3
    views = rng.integers(0, len(poses), size=candidates)
    u, v = rng.uniform(0, width, candidates), rng.uniform(0, height, candidates)
    origins, dirs = np.zeros((candidates, 3)), np.zeros((candidates, 3))
    for view, w2c in enumerate(poses):
        sel = views == view
        origins[sel], dirs[sel] = demo.pixel_rays(w2c, K, u[sel], v[sel])
    t, prim_ids = demo.cast(primitives, origins, dirs)
    hit = prim_ids >= 0
    points, prim_ids = origins[hit] + t[hit, None] * dirs[hit], prim_ids[hit]
    seen = np.zeros(len(points), dtype=int)
    for w2c in poses:
        uv, depth = demo.project(w2c, K, points)
        center = -w2c[:3, :3].T @ w2c[:3, 3]
        to_point = points - center
        dist = np.linalg.norm(to_point, axis=1)
        t_cam, _ = demo.cast(primitives, np.ascontiguousarray(np.broadcast_to(center, points.shape)), to_point / dist[:, None])
        in_frame = (depth > 0) & (uv[:, 0] >= 0) & (uv[:, 0] < width) & (uv[:, 1] >= 0) & (uv[:, 1] < height)
        seen += in_frame & (np.abs(t_cam - dist) < 1e-6 * dist + 1e-6)
    keep = np.flatnonzero(seen >= 2)[:NUM_POINTS]
    colors = demo.surface_color(primitives, points[keep], prim_ids[keep])
    noisy = points[keep] + rng.normal(0.0, 0.004, (len(keep), 3))
    return noisy, np.clip(colors + rng.normal(0.0, 0.02, colors.shape), 0, 1)


def write_ply(path: str, points: np.ndarray, colors: np.ndarray) -> None:
    """A point cloud as nerfstudio writes it (float xyz, uchar rgb)."""
    from plyfile import PlyData, PlyElement

    vertex = np.empty(len(points), dtype=[("x", "f4"), ("y", "f4"), ("z", "f4"),
                                          ("red", "u1"), ("green", "u1"), ("blue", "u1")])
    for i, key in enumerate("xyz"):
        vertex[key] = points[:, i]
    for i, key in enumerate(("red", "green", "blue")):
        vertex[key] = demo.to_uint8(colors[:, i])
    PlyData([PlyElement.describe(vertex, "vertex")], text=False).write(path)


def write_png(path: str, rgb: np.ndarray, alpha=None) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    bgr = demo.to_uint8(rgb)[:, :, ::-1]
    if alpha is not None:
        bgr = np.concatenate([bgr, demo.to_uint8(alpha)[:, :, None]], axis=2)
    cv2.imwrite(path, np.ascontiguousarray(bgr), [cv2.IMWRITE_PNG_COMPRESSION, 9])


def gl_matrix(w2c: np.ndarray) -> list:
    """OpenCV world-to-camera -> the OpenGL camera-to-world matrix transforms.json stores."""
    return (np.linalg.inv(w2c) @ GL_TO_CV).tolist()


def passer_by(w2c: np.ndarray, rng: np.random.Generator):
    """A sphere of a random colour, 1.2 to 2.2 units in front of the camera, off the image centre."""
    center = -w2c[:3, :3].T @ w2c[:3, 3]
    direction = w2c[2, :3] + w2c[0, :3] * rng.uniform(-0.35, 0.35) + w2c[1, :3] * rng.uniform(-0.25, 0.25)
    where = center + rng.uniform(1.2, 2.2) * direction / np.linalg.norm(direction)
    color = tuple(rng.uniform(0.0, 1.0, 3))
    return demo.Sphere(center=tuple(where), radius=PASSER_BY_RADIUS, color_a=color, color_b=color, pattern="checker",
                       frequency=1.0)


def changed_pixels(clean: np.ndarray, disturbed: np.ndarray) -> np.ndarray:
    """[H, W] bool: pixels the disturbance changed, grown by one pixel (its antialiased edge)."""
    changed = (np.abs(clean - disturbed).max(axis=2) > 1e-6).astype(np.uint8)
    return cv2.dilate(changed, np.ones((3, 3), np.uint8)) > 0


def make_forward(out_dir: str, with_points: bool, exposure: bool, passers_by: bool = False) -> None:
    rng = np.random.default_rng(16)
    walkers = np.random.default_rng(20)  # the passers-by: the same whichever other capture is made
    primitives = demo.demo_primitives()
    K = intrinsics(WIDTH, HEIGHT, FOCAL)
    poses = arc_poses(rng)
    look = np.random.default_rng(17)  # the exposures: the same whichever other capture is made
    frames = []
    for index, w2c in enumerate(poses):
        rgb, _ = render(primitives, w2c, K, WIDTH, HEIGHT)
        if passers_by:
            keep = np.ones((HEIGHT, WIDTH), dtype=bool)
            if index % TEST_EVERY:  # a training photo: someone walks through it
                disturbed, _ = render(primitives + [passer_by(w2c, walkers)], w2c, K, WIDTH, HEIGHT)
                keep = ~changed_pixels(rgb, disturbed)
                rgb = disturbed
            write_png(os.path.join(out_dir, f"masks/frame_{index:03d}.png"), np.repeat(keep[:, :, None], 3, axis=2) * 1.0)
        if exposure:
            gain = 2.0 ** look.uniform(-0.6, 0.6) * look.uniform(0.8, 1.2, 3)
            rgb = np.clip(rgb * gain, 0.0, 1.0)
        name = f"images/frame_{index:03d}.png"
        write_png(os.path.join(out_dir, name), rgb)
        frames.append({"file_path": name, "transform_matrix": gl_matrix(w2c)})
    data: Dict[str, object] = {"fl_x": FOCAL, "fl_y": FOCAL, "cx": WIDTH / 2, "cy": HEIGHT / 2, "w": WIDTH, "h": HEIGHT,
                               "aabb_scale": AABB_SCALE, "frames": frames}
    if with_points:
        points, colors = surface_points(primitives, poses, K, WIDTH, HEIGHT, np.random.default_rng(18))
        write_ply(os.path.join(out_dir, "points3d.ply"), points, colors)
        data["ply_file_path"] = "points3d.ply"
    with open(os.path.join(out_dir, "transforms.json"), "w") as f:
        json.dump(data, f, indent=1)


def synthetic_primitives() -> list:
    """The demo's objects without the ground, centred on the origin."""
    shift = -demo.LOOK_AT
    out = []
    for prim in demo.demo_primitives()[1:]:
        center = tuple(np.asarray(prim.center) + shift)
        out.append(type(prim)(**{**prim.__dict__, "center": center}))
    return out


def make_synthetic(out_dir: str) -> None:
    rng = np.random.default_rng(19)
    primitives = synthetic_primitives()
    focal = 0.5 * SYNTHETIC_SIZE / math.tan(0.5 * SYNTHETIC_ANGLE_X)
    K = intrinsics(SYNTHETIC_SIZE, SYNTHETIC_SIZE, focal)
    for split, count in (("train", SYNTHETIC_TRAIN), ("test", SYNTHETIC_TEST)):
        frames = []
        for index, w2c in enumerate(sphere_poses(count, rng)):
            rgb, alpha = render(primitives, w2c, K, SYNTHETIC_SIZE, SYNTHETIC_SIZE, background=np.zeros(3))
            rgb = rgb / np.maximum(alpha, 1e-6)[:, :, None]  # straight (not premultiplied) alpha, as PNG stores
            name = f"{split}/r_{index}"
            write_png(os.path.join(out_dir, name + ".png"), np.clip(rgb, 0, 1), alpha)
            frames.append({"file_path": f"./{name}", "rotation": 0.0, "transform_matrix": gl_matrix(w2c)})
        with open(os.path.join(out_dir, f"transforms_{split}.json"), "w") as f:
            json.dump({"camera_angle_x": SYNTHETIC_ANGLE_X, "frames": frames}, f, indent=1)


def make_capture(name: str, out_dir: str) -> str:
    """Write capture `name` into out_dir/name; returns that folder."""
    folder = os.path.join(out_dir, name)
    os.makedirs(folder, exist_ok=True)
    if name == "synthetic":
        make_synthetic(folder)
    elif name in ("forward", "forward_points", "exposure", "masks"):
        make_forward(folder, with_points=name != "forward", exposure=name == "exposure", passers_by=name == "masks")
    else:
        raise ValueError(f"unknown capture {name!r} (choose from {', '.join(CAPTURES)})")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder to write the captures into")
    parser.add_argument("names", nargs="*", default=list(CAPTURES), help=f"captures to make (default: all of {', '.join(CAPTURES)})")
    args = parser.parse_args()
    for name in args.names:
        start = time.perf_counter()
        print(f"wrote {make_capture(name, args.out)} in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
