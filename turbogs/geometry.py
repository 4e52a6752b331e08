"""Small camera and rotation geometry shared by the readers, the camera paths, the initial points
and the viewer: quaternions (w, x, y, z, COLMAP's and INRIA's order) and the point the cameras'
optical axes converge on. NumPy, float64 unless asked otherwise; the batched torch conversion the
renderer differentiates through is kernels.projection_torch.quat_to_rotmat.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

# Smallest eigenvalue of mean(I - d d^T) over the axes d: below it (axes spread by less than about
# 4 degrees) the axes are taken as parallel and meet nowhere.
MIN_CONVERGENCE = 0.005


def normalize(v: np.ndarray) -> np.ndarray:
    return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)


def quat_to_rotmat(quats: np.ndarray, dtype=np.float64) -> np.ndarray:
    """Quaternions [..., 4] -> rotation matrices [..., 3, 3], in `dtype` throughout. Normalised
    first, as COLMAP does, so that a slightly denormalised file still gives a rotation (the
    viewer converts millions of Gaussians with it in float32)."""
    q = normalize(np.asarray(quats, dtype=dtype))
    w, x, y, z = np.moveaxis(q, -1, 0)
    rotations = np.stack(
        [
            1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
            2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
            2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
        ],
        axis=-1,
    )  # fmt: skip
    return rotations.reshape(q.shape[:-1] + (3, 3))


def rotmat_to_quat(r: np.ndarray) -> np.ndarray:
    """Unit quaternion of a 3x3 rotation, with w >= 0 (Shepperd's method: stable for every
    rotation, 180-degree turns included)."""
    r = np.asarray(r, dtype=np.float64)
    trace = np.trace(r)
    if trace > 0:
        s = 2.0 * math.sqrt(1.0 + trace)
        q = [0.25 * s, (r[2, 1] - r[1, 2]) / s, (r[0, 2] - r[2, 0]) / s, (r[1, 0] - r[0, 1]) / s]
    else:
        i = int(np.argmax(np.diag(r)))
        j, k = (i + 1) % 3, (i + 2) % 3
        s = 2.0 * math.sqrt(max(1.0 + r[i, i] - r[j, j] - r[k, k], 1e-12))
        q = [0.0] * 4
        q[0] = (r[k, j] - r[j, k]) / s
        q[1 + i] = 0.25 * s
        q[1 + j] = (r[j, i] + r[i, j]) / s
        q[1 + k] = (r[k, i] + r[i, k]) / s
    q = normalize(np.array(q))
    return q if q[0] >= 0 else -q


def nearest_point_to_lines(origins: np.ndarray, dirs: np.ndarray,
                           min_convergence: float = MIN_CONVERGENCE) -> Optional[np.ndarray]:
    """The point with the least summed squared distance to the lines origins[i] + s * dirs[i]
    (unit dirs): solves mean_i(P_i) p = mean_i(P_i o_i) with P_i = I - d_i d_i^T. None when the
    lines are (nearly) parallel by `min_convergence`, or fewer than two, and so meet nowhere."""
    if len(origins) < 2:
        return None
    projectors = np.eye(3)[None] - dirs[:, :, None] * dirs[:, None, :]
    a = projectors.mean(axis=0)
    if np.linalg.eigvalsh(a)[0] < min_convergence:
        return None
    return np.linalg.solve(a, np.einsum("nij,nj->i", projectors, origins) / len(origins))
