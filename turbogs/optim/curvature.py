"""The curvature estimate of the hybrid optimizer (turbogs/optim/hybrid.py): a Gauss-Newton diagonal
from one first-order backward pass, and the quantile that calibrates its unknown scale.

Apart from the optimizer because it is a different idea: the estimator needs only autograd
and a random stream, and is tested against brute-force Jacobians on its own.
"""

from __future__ import annotations

import math
from typing import Dict, List, Mapping, Optional, Sequence, Union

import torch

from turbogs.gaussians import SH_C0

ParamsArg = Union[Sequence[torch.Tensor], Mapping[str, torch.Tensor]]
_QUANTILE_SAMPLE = 1 << 20  # ratios drawn for the calibration quantile when there are more


def rademacher(shape: torch.Size, generator: Optional[torch.Generator], device: torch.device,
               dtype: torch.dtype) -> torch.Tensor:
    """Independent +-1 entries with probability 1/2 each. They are drawn on the generator's
    device (a CPU generator may drive a CUDA run) and then moved."""
    draw_device = device if generator is None else generator.device
    bits = torch.randint(0, 2, tuple(shape), generator=generator, device=draw_device, dtype=torch.uint8)
    return bits.to(device=device, dtype=dtype).mul_(2).sub_(1)


def gauss_newton_diagonal_sample(
    outputs: torch.Tensor,
    params: ParamsArg,
    generator: Optional[torch.Generator] = None,
    loss_hessian_scale: Union[float, torch.Tensor] = 1.0,
    retain_graph: bool = True,
) -> Union[List[torch.Tensor], Dict[str, torch.Tensor]]:
    """One unbiased sample of the Gauss-Newton diagonal, from one first-order backward pass.

    Let y = outputs (e.g. rendered pixels), J = dy/dtheta and the loss's Hessian in y
    be diagonal with entries c_j = `loss_hessian_scale` (a scalar, or a tensor that
    broadcasts to `outputs`). The Gauss-Newton matrix is G = J^T diag(c) J. With
    Rademacher u (+-1) shaped like y, this returns s * s for

        s = J^T (sqrt(c) * u)        (one vector-Jacobian product: autograd.grad).

    E[s_i^2] = sum_jk sqrt(c_j c_k) J_ji J_ki E[u_j u_k] = sum_j c_j J_ji^2 = G_ii,
    so the sample is unbiased for diag(G) and needs no second derivative (gsplat's
    rasterizer has none). Its variance is 2 ((sum_j a_j^2)^2 - sum_j a_j^4) with
    a_j = sqrt(c_j) J_ji: a relative standard deviation of at most sqrt(2) per sample,
    smaller than with Gaussian u.

    Which loss Hessian: c = 1 is exact for 0.5 * ||y - target||^2. The splatting loss is
    L1 + D-SSIM (+ NCC). L1's Hessian is zero almost everywhere. SSIM's and NCC's couple
    the pixels of a window, which a diagonal c cannot express. So this estimates the
    curvature of an L2-like surrogate with per-pixel curvature c (pass the loss's
    per-pixel weight divided by a residual scale). It is a curvature *scale* for the
    preconditioner, not the exact Hessian of the training loss.

    `params` is a list (a list comes back) or a name -> tensor mapping (a dict comes
    back). A parameter that `outputs` does not depend on gets zeros. The graph is
    retained by default, so the loss's own backward pass can follow.
    """
    named = isinstance(params, Mapping)
    tensors = list(params.values()) if named else list(params)
    if torch.is_tensor(loss_hessian_scale):
        if bool((loss_hessian_scale < 0).any()):
            raise ValueError("loss_hessian_scale must be non-negative (it is a curvature)")
        root = loss_hessian_scale.to(device=outputs.device, dtype=outputs.dtype).sqrt()
    else:
        if loss_hessian_scale < 0:
            raise ValueError(f"loss_hessian_scale must be non-negative (it is a curvature), got {loss_hessian_scale}")
        root = math.sqrt(loss_hessian_scale)
    probe = rademacher(outputs.shape, generator, outputs.device, outputs.dtype) * root
    grads = torch.autograd.grad(outputs, tensors, grad_outputs=probe, retain_graph=retain_graph, allow_unused=True)
    samples = [torch.zeros_like(p) if g is None else (g * g).detach() for p, g in zip(tensors, grads)]
    return dict(zip(params.keys(), samples)) if named else samples


def colour_curvature_bound(pixels: torch.Tensor, alpha: torch.Tensor, sh0: torch.Tensor,
                           retain_graph: bool = True) -> torch.Tensor:
    """The Gauss-Newton matrix's row sums in the colours' DC coefficients: exact, from one
    vector-Jacobian product, and a bound on the matrix (so the step it preconditions descends).

    With the blending weights w_ip fixed, a pixel's colour is linear in each Gaussian's DC
    coefficient: dC_p / d dc_i = SH_C0 w_ip (per channel; zero where the colour is clamped at 0).
    Every entry of that Jacobian J is non-negative, so the diagonal D = diag(J^T J 1) bounds J^T J
    from above (a symmetric matrix with non-negative entries is at most its row sums, by
    Gershgorin): the step -g / D can never overshoot the L2 surrogate's minimum along any
    combination of colours, where a diagonal of J^T J alone may, for Gaussians that overlap.
    And J 1, the sum over the Gaussians of a pixel, is SH_C0 times its accumulated opacity
    (exactly, where no colour is clamped; above it otherwise, which keeps the bound), so D is
    J^T (SH_C0 alpha): one backward pass, no probe, no noise. Why this matters: unlike the
    sample of gauss_newton_diagonal_sample, it needs no averaging over many steps to be usable.

    `pixels` [M, 3] and `alpha` [M, 1] are the same rendered pixels; returns [N, 1, 3] like `sh0`."""
    probe = (SH_C0 * alpha.detach()).expand_as(pixels)
    grad, = torch.autograd.grad(pixels, [sh0], grad_outputs=probe, retain_graph=retain_graph, allow_unused=True)
    return torch.zeros_like(sh0) if grad is None else grad.detach().clamp_min(0)


def calibration_quantile(adam: torch.Tensor, curvature: torch.Tensor, q: float) -> torch.Tensor:
    """The q-quantile (float64, 0-d, on the device) of adam / curvature over the coordinates
    where both are positive; 0 when there are none. No host read: the other coordinates
    become NaN and `nanquantile` skips them, which gives the quantile of the selected ratios
    exactly (the same sort, the same ranks q * (count - 1), the same interpolation), where a
    boolean selection would read its count. Above 2^20 coordinates (torch's quantile limit
    is 2^24) a uniform sample of all coordinates stands in, so about the same share of the
    selected ones."""
    usable = (curvature > 0) & (adam > 0)
    ratio = torch.where(usable, adam / curvature, torch.full((), math.nan, dtype=adam.dtype, device=adam.device))
    ratio = ratio.reshape(-1)
    if ratio.numel() > _QUANTILE_SAMPLE:
        ratio = ratio[torch.randint(ratio.numel(), (_QUANTILE_SAMPLE,), device=ratio.device)]
    if ratio.dtype not in (torch.float32, torch.float64):
        ratio = ratio.float()  # torch.quantile's dtypes
    value = torch.nanquantile(ratio, q).double()
    return torch.nan_to_num(value, nan=0.0)  # all NaN: no coordinate has both yet
