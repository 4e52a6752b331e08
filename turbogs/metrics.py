"""Image quality metrics: PSNR, SSIM (INRIA's exact convention), LPIPS-VGG if available, and the
affine colour fit behind the colour-corrected PSNR.

Images are channel-last, [H, W, C] (or [B, H, W, C]) with values in [0, 1], the layout
the renderer produces.

SSIM follows INRIA's `utils/loss_utils.ssim`, so numbers are comparable with published
3DGS results: an 11x11 Gaussian window (sigma 1.5), zero padding of 5 pixels ("same"
output size), C1 = 0.01^2, C2 = 0.03^2, and the mean of the SSIM map over all pixels and
channels. It is differentiable, because training uses D-SSIM = 1 - SSIM as a loss. The
Gaussian window is separable, so it runs as a vertical then a horizontal 1D convolution;
with zero padding that equals INRIA's 2D convolution exactly, at a fifth of the cost.

LPIPS needs pretrained weights. They are used only if already on disk: nothing is ever
downloaded. Without them `lpips_or_none` returns None and `lpips_unavailable_reason`
says why, so a caller can print "LPIPS skipped: <reason>".
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F

from turbogs.errors import TurboGSError
from turbogs.tiles import listed_pixels, listed_values, sampled_pixels

ImageLike = Union[torch.Tensor, np.ndarray]

SSIM_WINDOW = 11
SSIM_SIGMA = 1.5
SSIM_C1 = 0.01**2
SSIM_C2 = 0.03**2


def _as_tensor(x: ImageLike) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x))


# --- PSNR -------------------------------------------------------------------------


def psnr(img: ImageLike, gt: ImageLike, mask: Optional[ImageLike] = None) -> float:
    """Peak signal-to-noise ratio in dB for images in [0, 1] (peak 1).

    With `mask` ([H, W] or [H, W, 1], bool or weights) the mean squared error is taken over
    the masked pixels only, e.g. to score the object and not a blank background.
    Identical images give +inf.
    """
    img = _as_tensor(img).detach().to(torch.float64)
    gt = _as_tensor(gt).detach().to(device=img.device, dtype=torch.float64)
    if img.shape != gt.shape:
        raise ValueError(f"psnr: image {tuple(img.shape)} and ground truth {tuple(gt.shape)} differ in shape")
    sq_err = (img - gt) ** 2
    if mask is None:
        mse = sq_err.mean()
    else:
        weights = _as_tensor(mask).detach().to(device=img.device, dtype=torch.float64)
        if weights.dim() == sq_err.dim() - 1:
            weights = weights[..., None]
        weights = weights.expand_as(sq_err)
        if float(weights.sum()) <= 0:
            raise ValueError("psnr: the mask selects no pixels")
        mse = (sq_err * weights).sum() / weights.sum()
    mse = float(mse)
    return math.inf if mse == 0 else -10.0 * math.log10(mse)


# --- SSIM -------------------------------------------------------------------------


@torch.no_grad()
def sampled_psnr(image: torch.Tensor, gt: torch.Tensor, tile_mask: Optional[torch.Tensor],
                 mask: Optional[torch.Tensor] = None) -> Optional[float]:
    """PSNR over the pixels a training step rendered (the others are undefined) and the mask
    keeps. None when no valid pixel was rendered (rather than a false 0 dB)."""
    value = float(sampled_psnr_tensor(image, gt, tile_mask, mask))
    return None if math.isnan(value) else value


def sampled_psnr_tensor(image: torch.Tensor, gt: torch.Tensor, tile_mask: Optional[torch.Tensor],
                        mask: Optional[torch.Tensor] = None, tile_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
    """sampled_psnr as a 0-d tensor on the image's device, with no host read (the progress
    bar's figure, read only when the bar refreshes): a masked sum, not a boolean index,
    and torch.where keeps the undefined pixels' possible NaNs out. NaN when no pixel is
    both rendered and kept by the mask (0 / 0; clamp and log keep it NaN): the bar then
    keeps its last figure. Every step runs it, so it is written in few ops. `tile_ids`: the
    tiles of `tile_mask` listed (the sampler's); then only their pixels are read, so that a
    step on a quarter of the tiles pays a quarter of the image's worth."""
    image = image.detach()
    if tile_ids is not None and tile_mask is not None:
        # One sum over pixels and channels, not a mean over each pixel's 3 channels first: a
        # reduction over 3 values a row is several times slower on the CPU, for the same value.
        flat, valid = listed_pixels(tile_ids, image.shape[0], image.shape[1])
        if mask is not None:
            valid = valid & (listed_values(mask, flat).reshape(-1) > 0.5)
        pixels = listed_values(image, flat).clamp(0, 1)
        diff = pixels - listed_values(gt, flat).to(pixels)
        channels = image.shape[-1]
        mse = torch.where(valid[:, None], diff * diff, 0.0).sum() / (valid.sum() * channels)
        return -10 * torch.log10(mse.clamp_min(1e-10))
    image = image.clamp(0, 1)
    if tile_mask is None and mask is None:  # every pixel (the 3dgs step)
        return -10 * torch.log10(F.mse_loss(image, gt).clamp_min(1e-10))
    height, width = image.shape[:2]
    inside = sampled_pixels(tile_mask, width, height, image.device)
    if mask is not None:
        inside = inside & (mask > 0.5)
    error = F.mse_loss(image, gt, reduction="none").mean(dim=-1)
    mse = torch.where(inside, error, 0.0).sum() / inside.sum()
    return -10 * torch.log10(mse.clamp_min(1e-10))


def gaussian_kernel_1d(size: int = SSIM_WINDOW, sigma: float = SSIM_SIGMA) -> torch.Tensor:
    """Normalized samples of exp(-x^2 / 2 sigma^2) at x = -size//2 .. size//2, float64."""
    x = torch.arange(size, dtype=torch.float64) - size // 2
    g = torch.exp(-(x**2) / (2 * sigma**2))
    return g / g.sum()


@functools.lru_cache(maxsize=8)
def _cached_kernel(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """gaussian_kernel_1d() on a device, made once: the training loss calls ssim every step."""
    return gaussian_kernel_1d().to(device=device, dtype=dtype)


@functools.lru_cache(maxsize=16)
def _blur_weights(device: torch.device, dtype: torch.dtype, channels: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The vertical and horizontal conv2d weights of the blur, made once per channel count
    (four view ops per blur otherwise)."""
    kernel = _cached_kernel(device, dtype)
    size = kernel.numel()
    return kernel.view(1, 1, size, 1).expand(channels, 1, size, 1), kernel.view(1, 1, 1, size).expand(channels, 1, 1, size)


def _blur(x: torch.Tensor, kernel: torch.Tensor) -> torch.Tensor:
    """Zero-padded 'same' Gaussian blur of each channel of [B, C, H, W]."""
    channels, size = x.shape[1], kernel.numel()
    vertical, horizontal = _blur_weights(kernel.device, kernel.dtype, channels)
    x = F.conv2d(x, vertical, padding=(size // 2, 0), groups=channels)
    return F.conv2d(x, horizontal, padding=(0, size // 2), groups=channels)


def ssim_map(img: torch.Tensor, gt: torch.Tensor) -> torch.Tensor:
    """Per-pixel SSIM, same shape as the inputs ([H, W, C] or [B, H, W, C]).

    The five moments (x, y, x^2, y^2, xy) are blurred together, as one stack of
    5C channels: the blur is per channel, so this is the same arithmetic (bit for bit) in two
    convolutions instead of ten (the 3dgs loss runs it every step)."""
    img, gt = _as_tensor(img), _as_tensor(gt)
    if img.shape != gt.shape or img.dim() not in (3, 4):
        raise ValueError(
            f"ssim: expected two [H, W, C] or [B, H, W, C] images, got {tuple(img.shape)} and {tuple(gt.shape)}"
        )
    gt = gt.to(img)
    single = img.dim() == 3
    channels = img.shape[-1]
    moments = torch.cat([img, gt, img * img, gt * gt, img * gt], dim=-1)  # [(B,) H, W, 5C]
    moments = (moments[None] if single else moments).permute(0, 3, 1, 2)
    kernel = _cached_kernel(moments.device, moments.dtype)
    mu_x, mu_y, mean_xx, mean_yy, mean_xy = _blur(moments, kernel).split(channels, dim=1)

    mu_x2, mu_y2, mu_xy = mu_x**2, mu_y**2, mu_x * mu_y
    var_x, var_y, cov_xy = mean_xx - mu_x2, mean_yy - mu_y2, mean_xy - mu_xy
    numerator = (2 * mu_xy + SSIM_C1) * (2 * cov_xy + SSIM_C2)
    denominator = (mu_x2 + mu_y2 + SSIM_C1) * (var_x + var_y + SSIM_C2)
    out = (numerator / denominator).permute(0, 2, 3, 1)
    return out[0] if single else out


def ssim(img: torch.Tensor, gt: torch.Tensor) -> torch.Tensor:
    """Mean SSIM as a 0-dim tensor (differentiable; `float()` it for reporting)."""
    return ssim_map(img, gt).mean()


# --- LPIPS ------------------------------------------------------------------------

# torchvision's ImageNet VGG16 checkpoint, as cached by torch.hub.
_VGG16_CHECKPOINT = "vgg16-397923af.pth"


def _vgg16_checkpoint() -> Path:
    return Path(torch.hub.get_dir()) / "checkpoints" / _VGG16_CHECKPOINT


def lpips_unavailable_reason() -> Optional[str]:
    """None if LPIPS-VGG can run from local files alone, else a short reason."""
    if importlib.util.find_spec("lpips") is None:
        return "the 'lpips' package is not installed"
    try:
        lpips = importlib.import_module("lpips")
    except Exception as e:  # lpips imports torchvision, which may be missing or broken
        return f"cannot import lpips ({type(e).__name__}: {e})"
    linear_weights = Path(lpips.__file__).parent / "weights" / "v0.1" / "vgg.pth"
    if not linear_weights.is_file():
        return f"LPIPS linear weights not found at {linear_weights}"
    if not _vgg16_checkpoint().is_file():
        return f"VGG16 weights not found at {_vgg16_checkpoint()} (never downloaded by TurboGS)"
    return None


@contextmanager
def _downloads_forbidden() -> Iterator[None]:
    """Make any torch.hub download raise instead of reaching the network."""

    def refuse(url, *args, **kwargs):
        raise TurboGSError(f"LPIPS would download {url}; only local weights are used")

    original = torch.hub.download_url_to_file
    torch.hub.download_url_to_file = refuse
    try:
        yield
    finally:
        torch.hub.download_url_to_file = original


class LPIPS:
    """LPIPS with the VGG backbone (INRIA's choice), from local weights only."""

    def __init__(self, device: Union[str, torch.device] = "cpu"):
        reason = lpips_unavailable_reason()
        if reason is not None:
            raise TurboGSError(f"LPIPS unavailable: {reason}")
        import lpips

        with _downloads_forbidden():
            self.model = lpips.LPIPS(net="vgg", verbose=False).to(device).eval()
        self.device = torch.device(device)

    @torch.no_grad()
    def __call__(self, img: ImageLike, gt: ImageLike) -> float:
        """LPIPS distance of two [H, W, 3] images in [0, 1] (lower is better)."""
        x = _as_tensor(img).detach().to(self.device, torch.float32).permute(2, 0, 1)[None]
        y = _as_tensor(gt).detach().to(self.device, torch.float32).permute(2, 0, 1)[None]
        return float(self.model(x, y, normalize=True).mean())


def lpips_or_none(device: Union[str, torch.device] = "cpu") -> Optional[LPIPS]:
    """An LPIPS scorer, or None when its weights are not on disk (see lpips_unavailable_reason)."""
    if lpips_unavailable_reason() is not None:
        return None
    return LPIPS(device)


def affine_color_fit(image: torch.Tensor, gt: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """`image` after the least-squares affine colour map (3x3 + bias) that best matches `gt`
    over the valid pixels, clamped to [0, 1]: the render as the photo's exposure and white
    balance would show it, for the colour-corrected PSNR."""
    x = image.reshape(-1, 3).double()
    y = gt.reshape(-1, 3).double()
    rows = torch.ones(len(x), dtype=torch.bool, device=x.device) if mask is None else mask.reshape(-1) > 0.5
    design = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype, device=x.device)], dim=1)
    if int(rows.sum()) < 4:
        return image.clamp(0, 1)
    # Normal equations with a tiny ridge: a flat image (rank-deficient) still solves.
    a = design[rows]
    gram = a.T @ a + 1e-8 * torch.eye(4, dtype=x.dtype, device=x.device)
    coefficients = torch.linalg.solve(gram, a.T @ y[rows])
    return (design @ coefficients).reshape(image.shape).clamp(0, 1).to(image.dtype)
