"""Pre-activation Gaussian parameters -> the arrays viser's splat renderer draws.

viser's `add_gaussian_splats` wants *activated* values: world-space centers, full 3x3
covariances, an RGB color and an opacity per Gaussian. The model stores log scales,
unnormalized quaternions, opacity logits and SH coefficients (see turbogs/gaussians.py),
so this module applies the activations:

    covariance = R S S R^T   with R from the normalized wxyz quaternion, S = diag(exp(scales))
    rgb        = clamp(0.5 + SH_C0 * sh0, 0, 1)    (the view-independent DC color)
    opacity    = sigmoid(logit)

The browser only evaluates the DC band, so higher SH bands are not sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from turbogs.gaussians import SH_C0
from turbogs.geometry import quat_to_rotmat


@dataclass
class Splats:
    """Activated Gaussians in the shapes viser expects."""

    centers: np.ndarray  # [N, 3] float32
    covariances: np.ndarray  # [N, 3, 3] float32, symmetric positive semi-definite
    rgbs: np.ndarray  # [N, 3] float32 in [0, 1]
    opacities: np.ndarray  # [N, 1] float32 in [0, 1]

    def __len__(self) -> int:
        return self.centers.shape[0]


def to_numpy(x) -> np.ndarray:
    """A torch tensor (any device, grad or not) or array-like -> float32 numpy."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float32)


def splats_from_params(params: Mapping[str, object]) -> Splats:
    """Activate a raw parameter dict (numpy arrays or torch tensors, as stored by
    `Gaussians.raw()` or returned by `turbogs.formats.ply.read_ply`)."""
    means = to_numpy(params["means"]).reshape(-1, 3)
    n = means.shape[0]
    log_scales = to_numpy(params["scales"]).reshape(n, 3)
    rotations = quat_to_rotmat(to_numpy(params["quats"]).reshape(n, 4), dtype=np.float32)
    with np.errstate(over="ignore"):
        scales = np.exp(log_scales)
    # R S S R^T == (R S)(R S)^T; R S scales the columns of R.
    rs = rotations * scales[:, None, :]
    covariances = rs @ rs.transpose(0, 2, 1)

    dc = to_numpy(params["sh0"]).reshape(n, 3)
    rgbs = np.clip(0.5 + SH_C0 * dc, 0.0, 1.0)
    logits = to_numpy(params["opacities"]).reshape(n, 1)
    opacities = 0.5 * (1.0 + np.tanh(0.5 * logits))  # sigmoid without overflow warnings
    return Splats(
        centers=means.astype(np.float32),
        covariances=covariances.astype(np.float32),
        rgbs=rgbs.astype(np.float32),
        opacities=opacities.astype(np.float32),
    )


def robust_bounds(centers: np.ndarray, quantile: float = 0.01) -> np.ndarray:
    """[2, 3] low/high corners holding the central mass of the Gaussians. Trained scenes
    have far-away floaters; the raw min/max would put the camera miles from the scene."""
    if centers.shape[0] == 0:
        return np.array([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])
    lo = np.quantile(centers, quantile, axis=0)
    hi = np.quantile(centers, 1.0 - quantile, axis=0)
    return np.stack([lo, hi]).astype(np.float64)
