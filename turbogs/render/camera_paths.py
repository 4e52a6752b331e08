"""Camera paths for fly-through videos, built from the training cameras' poses.

Every pose is a 4x4 camera-to-world matrix in OpenCV axes (x right, y down, z forward), as
cameras.json stores them. Three paths:

    orbit        a full circle around the cameras' focus (the point nearest all their optical
                 axes, by least squares), at the cameras' mean distance from the up axis through
                 the focus and their mean height above it; every frame looks at the focus
    spiral       LLFF's forward-facing path: the average camera swings on an ellipse (radii
                 from the spread of the camera centres) while it drifts in depth, two turns,
                 always looking at the point at the focus depth straight ahead
    interpolate  a smooth path through the training cameras in capture (name) order: positions
                 on a Catmull-Rom spline (it passes through every camera), rotations slerped

"Up" is the mean of the cameras' up vectors (-y), which is how people hold cameras.
"""

from __future__ import annotations

import math
from typing import List

import numpy as np

from turbogs.errors import InputError
from turbogs.geometry import nearest_point_to_lines, normalize, quat_to_rotmat, rotmat_to_quat

PARALLEL_AXES = 1e-8  # smallest eigenvalue of mean(I - d d^T) below which the axes meet nowhere

PATHS = ("orbit", "spiral", "interpolate")


# --- geometry helpers -----------------------------------------------------------------------


def look_at(eye: np.ndarray, target: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Camera-to-world (OpenCV axes) at `eye` looking at `target`, its -y as close to `up` as it can."""
    z = normalize(target - eye)
    x = cross = np.cross(z, up)
    if np.linalg.norm(cross) < 1e-9:  # looking straight along up: any x will do
        x = np.cross(z, np.array([1.0, 0.0, 0.0]) if abs(z[0]) < 0.9 else np.array([0.0, 1.0, 0.0]))
    x = normalize(x)
    y = np.cross(z, x)
    pose = np.eye(4)
    pose[:3, 0], pose[:3, 1], pose[:3, 2], pose[:3, 3] = x, y, z, eye
    return pose


def world_up(poses: np.ndarray) -> np.ndarray:
    return normalize(-poses[:, :3, 1].mean(axis=0))


def focus_point(poses: np.ndarray) -> np.ndarray:
    """The point nearest all the cameras' optical axes; with parallel axes, which meet nowhere, a
    point ahead of the cameras at their spread (at least one unit). A path only needs a point to
    aim at, so axes a degree apart (a forward-facing capture) still give theirs, far ahead."""
    centers, dirs = poses[:, :3, 3], normalize(poses[:, :3, 2])
    point = nearest_point_to_lines(centers, dirs, min_convergence=PARALLEL_AXES)
    if point is None:
        spread = float(np.linalg.norm(centers - centers.mean(0), axis=1).mean())
        return centers.mean(axis=0) + normalize(dirs.mean(axis=0)) * max(spread, 1.0)
    return point


def slerp(q0: np.ndarray, q1: np.ndarray, t: float) -> np.ndarray:
    """Constant-speed rotation from q0 to q1 along the shorter arc."""
    dot = float(np.dot(q0, q1))
    if dot < 0:
        q1, dot = -q1, -dot
    if dot > 0.9995:  # nearly equal: the arc is a line
        return normalize(q0 + t * (q1 - q0))
    angle = math.acos(dot)
    return (math.sin((1 - t) * angle) * q0 + math.sin(t * angle) * q1) / math.sin(angle)


def catmull_rom(p0, p1, p2, p3, t: float) -> np.ndarray:
    """Uniform Catmull-Rom point between p1 (t=0) and p2 (t=1)."""
    t2, t3 = t * t, t * t * t
    return 0.5 * (2 * p1 + (p2 - p0) * t + (2 * p0 - 5 * p1 + 4 * p2 - p3) * t2 + (3 * p1 - p0 - 3 * p2 + p3) * t3)


# --- the paths ------------------------------------------------------------------------------


def orbit(poses: np.ndarray, frames: int) -> List[np.ndarray]:
    focus, up = focus_point(poses), world_up(poses)
    rel = poses[:, :3, 3] - focus
    heights = rel @ up
    horizontal = rel - heights[:, None] * up
    radius = float(np.linalg.norm(horizontal, axis=1).mean())
    height = float(heights.mean())
    e1 = normalize(horizontal[0]) if np.linalg.norm(horizontal[0]) > 1e-9 else normalize(np.cross(up, [1.0, 0, 0]))
    e2 = np.cross(up, e1)
    angles = 2 * math.pi * np.arange(frames) / frames
    return [look_at(focus + height * up + radius * (math.cos(a) * e1 + math.sin(a) * e2), focus, up) for a in angles]


def spiral(poses: np.ndarray, frames: int, turns: float = 2.0, zrate: float = 0.5) -> List[np.ndarray]:
    centers = poses[:, :3, 3]
    center, up = centers.mean(axis=0), world_up(poses)
    forward = normalize(poses[:, :3, 2].mean(axis=0))
    average = look_at(center, center + forward, up)
    axes = average[:3, :3]
    depth = float((focus_point(poses) - center) @ forward)
    spread = np.percentile(np.abs((centers - center) @ axes), 90, axis=0)
    if not (depth > 0 and math.isfinite(depth)):
        depth = max(float(np.linalg.norm(centers - center, axis=1).max()) * 3.0, 1.0)
    radii = np.maximum(spread, 0.05 * depth)
    target = center + depth * forward
    out = []
    for theta in np.linspace(0.0, 2 * math.pi * turns, frames, endpoint=False):
        offset = np.array([math.cos(theta), math.sin(theta), math.sin(theta * zrate)]) * radii
        out.append(look_at(center + axes @ offset, target, up))
    return out


def interpolate(poses: np.ndarray, frames: int) -> List[np.ndarray]:
    """Through every pose in order; frame 0 is the first pose, the last frame the last pose."""
    count = len(poses)
    if count < 2:
        raise InputError(f"--path interpolate needs at least 2 cameras to pass through; the model has {count}")
    positions = poses[:, :3, 3]
    quats = [rotmat_to_quat(p[:3, :3]) for p in poses]
    for i in range(1, count):  # keep neighbours on one hemisphere, so slerp takes the short way
        if np.dot(quats[i - 1], quats[i]) < 0:
            quats[i] = -quats[i]
    padded = np.concatenate([2 * positions[:1] - positions[1:2], positions, 2 * positions[-1:] - positions[-2:-1]])
    out = []
    for s in np.linspace(0.0, count - 1, frames):
        seg = min(int(s), count - 2)
        t = float(s - seg)
        pose = np.eye(4)
        pose[:3, :3] = quat_to_rotmat(slerp(quats[seg], quats[seg + 1], t))
        pose[:3, 3] = catmull_rom(padded[seg], padded[seg + 1], padded[seg + 2], padded[seg + 3], t)
        out.append(pose)
    return out


def camera_path(kind: str, poses: np.ndarray, frames: int) -> List[np.ndarray]:
    """`frames` camera-to-world poses of the named path around/through `poses` [K, 4, 4]."""
    poses = np.asarray(poses, np.float64)
    if len(poses) == 0:
        raise InputError("the model has no cameras to build a camera path from")
    return {"orbit": orbit, "spiral": spiral, "interpolate": interpolate}[kind](poses, frames)
