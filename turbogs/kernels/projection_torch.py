"""Readable torch math for projecting Gaussians and colouring them: rotations, 3D and
screen-space covariances (EWA splatting), and real spherical harmonics.

The arithmetic follows gsplat 1.5.3's reference implementation operation for operation
(Apache-2.0; gsplat/cuda/_torch_impl.py), so that the CPU path and gsplat's CUDA kernels
agree; we keep our own copy because that module is private to gsplat and moves between
releases. One camera, no batch dimensions.
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor


def quat_to_rotmat(quats: Tensor) -> Tensor:
    """Rotation matrices [..., 3, 3] from (w, x, y, z) quaternions [..., 4] of any norm."""
    w, x, y, z = torch.unbind(F.normalize(quats, p=2, dim=-1), dim=-1)
    R = torch.stack(
        [
            1 - 2 * (y**2 + z**2), 2 * (x * y - w * z), 2 * (x * z + w * y),
            2 * (x * y + w * z), 1 - 2 * (x**2 + z**2), 2 * (y * z - w * x),
            2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x**2 + y**2),
        ],
        dim=-1,
    )
    return R.reshape(quats.shape[:-1] + (3, 3))


def covariance(quats: Tensor, scales: Tensor) -> Tensor:
    """World-space covariances [N, 3, 3] = R S S^T R^T, S = diag(scales)."""
    M = quat_to_rotmat(quats) * scales[..., None, :]
    return torch.einsum("...ij,...kj -> ...ik", M, M)


def world_to_camera(means: Tensor, covars: Tensor, viewmat: Tensor) -> Tuple[Tensor, Tensor]:
    """Means [N, 3] and covariances [N, 3, 3] in the frame of viewmat [4, 4] (world -> camera)."""
    R, t = viewmat[:3, :3], viewmat[:3, 3]
    means_c = torch.einsum("ij,nj->ni", R, means) + t[None, :]
    covars_c = torch.einsum("ij,njk,lk->nil", R, covars, R)
    return means_c, covars_c


def perspective_projection(means_c: Tensor, covars_c: Tensor, K: Tensor, width: int, height: int
                           ) -> Tuple[Tensor, Tensor]:
    """Pixel centers [N, 2] and screen covariances [N, 2, 2] of camera-space Gaussians, by
    the local affine (Jacobian) approximation of the pinhole projection. Points far outside
    the field of view are clamped to 1.3x of it before the Jacobian is taken, as in 3DGS,
    so that off-screen Gaussians do not get huge, unstable footprints."""
    tx, ty, tz = torch.unbind(means_c, dim=-1)
    tz2 = tz**2
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    tan_fovx, tan_fovy = 0.5 * width / fx, 0.5 * height / fy
    lim_x_pos = (width - cx) / fx + 0.3 * tan_fovx
    lim_x_neg = cx / fx + 0.3 * tan_fovx
    lim_y_pos = (height - cy) / fy + 0.3 * tan_fovy
    lim_y_neg = cy / fy + 0.3 * tan_fovy
    tx = tz * torch.clamp(tx / tz, min=-lim_x_neg, max=lim_x_pos)
    ty = tz * torch.clamp(ty / tz, min=-lim_y_neg, max=lim_y_pos)

    O = torch.zeros_like(tz)
    J = torch.stack([fx / tz, O, -fx * tx / tz2, O, fy / tz, -fy * ty / tz2], dim=-1).reshape(-1, 2, 3)
    cov2d = torch.einsum("...ij,...jk,...kl->...il", J, covars_c, J.transpose(-1, -2))
    means2d = torch.einsum("ij,nj->ni", K[:2, :3], means_c) / tz[..., None]
    return means2d, cov2d


def sh_bases(num_bases: int, dirs: Tensor) -> Tensor:
    """Real SH basis values [N, num_bases] (1, 4, 9, 16 or 25) along unit dirs [N, 3]:
    Sloan's recurrences ("Efficient Spherical Harmonic Evaluation", JCGT 2013), with the
    sign and order conventions of 3DGS."""
    result = torch.empty((*dirs.shape[:-1], num_bases), dtype=dirs.dtype, device=dirs.device)
    result[..., 0] = 0.2820947917738781
    if num_bases <= 1:
        return result
    x, y, z = dirs.unbind(-1)
    fTmpA = -0.48860251190292
    result[..., 2] = -fTmpA * z
    result[..., 3] = fTmpA * x
    result[..., 1] = fTmpA * y
    if num_bases <= 4:
        return result
    z2 = z * z
    fTmpB = -1.092548430592079 * z
    fTmpA = 0.5462742152960395
    fC1 = x * x - y * y
    fS1 = 2 * x * y
    result[..., 6] = 0.9461746957575601 * z2 - 0.3153915652525201
    result[..., 7] = fTmpB * x
    result[..., 5] = fTmpB * y
    result[..., 8] = fTmpA * fC1
    result[..., 4] = fTmpA * fS1
    if num_bases <= 9:
        return result
    fTmpC = -2.285228997322329 * z2 + 0.4570457994644658
    fTmpB = 1.445305721320277 * z
    fTmpA = -0.5900435899266435
    fC2 = x * fC1 - y * fS1
    fS2 = x * fS1 + y * fC1
    result[..., 12] = z * (1.865881662950577 * z2 - 1.119528997770346)
    result[..., 13] = fTmpC * x
    result[..., 11] = fTmpC * y
    result[..., 14] = fTmpB * fC1
    result[..., 10] = fTmpB * fS1
    result[..., 15] = fTmpA * fC2
    result[..., 9] = fTmpA * fS2
    if num_bases <= 16:
        return result
    fTmpD = z * (-4.683325804901025 * z2 + 2.007139630671868)
    fTmpC = 3.31161143515146 * z2 - 0.47308734787878
    fTmpB = -1.770130769779931 * z
    fTmpA = 0.6258357354491763
    fC3 = x * fC2 - y * fS2
    fS3 = x * fS2 + y * fC2
    result[..., 20] = 1.984313483298443 * z2 * (1.865881662950577 * z2 - 1.119528997770346) + -1.006230589874905 * (
        0.9461746957575601 * z2 - 0.3153915652525201
    )
    result[..., 21] = fTmpD * x
    result[..., 19] = fTmpD * y
    result[..., 22] = fTmpC * fC1
    result[..., 18] = fTmpC * fS1
    result[..., 23] = fTmpB * fC2
    result[..., 17] = fTmpB * fS2
    result[..., 24] = fTmpA * fC3
    result[..., 16] = fTmpA * fS3
    return result


def spherical_harmonics(degree: int, dirs: Tensor, coeffs: Tensor) -> Tensor:
    """Raw SH value [N, 3] of coeffs [N, K, 3] along dirs [N, 3] (normalized here), using
    the first (degree + 1)^2 bases; the caller adds 0.5."""
    num_bases = (degree + 1) ** 2
    if num_bases > coeffs.shape[-2]:
        raise ValueError(f"SH degree {degree} needs {num_bases} coefficients, got {coeffs.shape[-2]}")
    dirs = F.normalize(dirs, p=2, dim=-1)
    bases = torch.zeros_like(coeffs[..., 0])
    bases[..., :num_bases] = sh_bases(num_bases, dirs)
    return (bases[..., None] * coeffs).sum(dim=-2)
