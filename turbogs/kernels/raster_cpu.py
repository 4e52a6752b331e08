"""The rasterization chain on the CPU in C++ (cuda/cpu/) behind the signatures of its twins,
`raster_torch.project`, `raster_torch.spherical_harmonics`, `raster_torch.intersect_tiles` and
`raster_torch.rasterize`.

Why: the twin composites with dense [blocks, pixels, Gaussians] tensors, a few dozen torch
ops a chunk, which was most of a CPU training step under torch.profiler.
The native kernel walks each pixel's Gaussians once, stops where the pixel is opaque, and
runs the tiles in parallel on torch's threads, with results that do not depend on how many.

The module (`turbogs_cpu`) is compiled on first use by torch.utils.cpp_extension from the
sources in cuda/cpu/ (cuda/build.py `load_cpu_jit`, cached under ~/.cache/turbogs/build/cpu),
needing a C++ compiler and nothing of CUDA. Unlike the CUDA kernels, a CPU build that fails
is not an error: the twins compute the same thing, slower, and one line says so and how to
get the fast path. The tile intersection is native too (cuda/cpu/intersect_cpu.cpp, the
twin's output bit for bit: a counting sort instead of expanding and sorting every pair), and so
are the spherical harmonics (sh_cpu.cpp) and the projection (projection_cpu.cpp): one loop
iteration a Gaussian instead of some 60 and 80 small torch ops a step.
"""

from __future__ import annotations

import sys
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from turbogs.kernels import raster_torch
from turbogs.kernels.turbo_cuda import build_module
from turbogs.tiles import TILE_SIZE

_state = {"module": None, "tried": False}


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def load(log: Optional[Callable[[str], None]] = None) -> bool:
    """Build (once per machine) and load the CPU kernels; whether they are there. Tried once
    per process: a failure is said in one line and the twins run from then on."""
    if _state["tried"]:
        return _state["module"] is not None
    _state["tried"] = True
    log = log or _stderr
    try:
        build = build_module()
        if not build.cpu_build_is_current():
            log("compiling TurboGS's CPU kernels (once)")
        _state["module"] = build.load_cpu_jit()
    except Exception as exc:  # no compiler, a failed compile, a missing source: the twins run
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        log(f"TurboGS's CPU kernels could not be built ({first_line[:200]}): the torch twins run instead, "
            "several times slower; install a C++ compiler (g++ or clang) for the fast path")
    return _state["module"] is not None


def forget() -> None:
    """Load again on the next call (tests)."""
    _state["module"], _state["tried"] = None, False


def native_module():
    """The built module (turbogs_cpu); the dispatch only calls for it after `load()` succeeded."""
    if not load():
        raise RuntimeError("TurboGS's CPU kernels are not built")
    return _state["module"]


class _Rasterize(torch.autograd.Function):
    """The kernel's forward and its written-out backward. Besides the image and alpha, the
    forward leaves per pixel its final transmittance and the last Gaussian it used, from which
    the backward walks back to front (two floats a pixel)."""

    @staticmethod
    def forward(ctx, means2d, conics, colors, opacities, background, tiles, isect_offsets, flatten_ids, size):
        width, height, tile_size = size
        bg = background if background is not None else colors.new_empty(0)
        image, alpha, transmittance, last = native_module().rasterize_forward(
            means2d, conics, colors, opacities, bg, tiles, isect_offsets, flatten_ids, width, height, tile_size
        )
        ctx.save_for_backward(means2d, conics, colors, opacities, bg, tiles, isect_offsets, flatten_ids, alpha,
                              transmittance, last)
        ctx.size, ctx.has_background = size, background is not None
        return image, alpha

    @staticmethod
    def backward(ctx, grad_image, grad_alpha):
        means2d, conics, colors, opacities, bg, tiles, isect_offsets, flatten_ids, *state = ctx.saved_tensors
        width, height, tile_size = ctx.size
        grad_image = grad_image.contiguous() if grad_image is not None else torch.zeros(
            height, width, colors.shape[-1], dtype=colors.dtype)
        grad_alpha = grad_alpha.contiguous() if grad_alpha is not None else torch.zeros(
            height, width, 1, dtype=colors.dtype)
        g_means, g_conics, g_colors, g_opacities, g_background = native_module().rasterize_backward(
            means2d, conics, colors, opacities, bg, tiles, isect_offsets, flatten_ids, width, height, tile_size,
            *state, grad_image, grad_alpha,
        )
        return (g_means, g_conics, g_colors, g_opacities, g_background if ctx.has_background else None,
                None, None, None, None)


def rasterize(
    means2d: Tensor,
    conics: Tensor,
    colors: Tensor,
    opacities: Tensor,
    width: int,
    height: int,
    tile_size: int,
    isect_offsets: Tensor,
    flatten_ids: Tensor,
    background: Optional[Tensor] = None,
    tile_mask: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """Same inputs, outputs and rules as `raster_torch.rasterize` (the pixels of tiles left
    out by `tile_mask` are 0 and get no gradient). All float inputs take the colors' dtype."""
    dtype = colors.dtype
    tile_height, tile_width = isect_offsets.shape
    if tile_mask is None:
        tiles = torch.arange(tile_width * tile_height)
    else:
        tiles = torch.nonzero(tile_mask.reshape(-1)).squeeze(1)
    return _Rasterize.apply(
        means2d.to(dtype).contiguous(), conics.to(dtype).contiguous(), colors.contiguous(),
        opacities.to(dtype).contiguous(), None if background is None else background.to(dtype).contiguous(),
        tiles.long().contiguous(), isect_offsets.int().contiguous(), flatten_ids.int().contiguous(),
        (int(width), int(height), int(tile_size)),
    )


class _Project(torch.autograd.Function):
    """projection_cpu.cpp's forward and its written-out backward (to means, quats, scales).
    The backward recomputes the forward's intermediates; it keeps only the radii (who was culled)."""

    @staticmethod
    def forward(ctx, means, quats, scales, viewmat, K, width, height, near_plane, far_plane, eps2d, antialiased,
                tile_mask, tile_size):
        radii, means2d, depths, conics, compensations = native_module().project_forward(
            means, quats, scales, viewmat, K, width, height, near_plane, far_plane, eps2d, antialiased, tile_mask,
            tile_size)
        ctx.save_for_backward(means, quats, scales, viewmat, K, radii)
        ctx.size, ctx.eps2d, ctx.antialiased = (width, height), eps2d, antialiased
        ctx.mark_non_differentiable(radii)
        return radii, means2d, depths, conics, compensations

    @staticmethod
    def backward(ctx, _grad_radii, grad_means2d, grad_depths, grad_conics, grad_compensations):
        means, quats, scales, viewmat, K, radii = ctx.saved_tensors
        n = means.shape[0]

        def dense(grad, *shape):  # autograd passes None for an output nobody used
            return grad.contiguous() if grad is not None else means.new_zeros(shape)

        g_means, g_quats, g_scales = native_module().project_backward(
            means, quats, scales, viewmat, K, *ctx.size, ctx.eps2d, radii, dense(grad_means2d, n, 2),
            dense(grad_depths, n), dense(grad_conics, n, 3),
            dense(grad_compensations, n) if ctx.antialiased else means.new_empty(0),
        )
        return g_means, g_quats, g_scales, None, None, None, None, None, None, None, None, None, None


def project(means, quats, scales, viewmat, K, width, height, near_plane, far_plane, eps2d, antialiased=False,
            tile_mask=None, tile_size=TILE_SIZE):
    """Same inputs, outputs and rules as `raster_torch.project`: in C++ for one camera whose
    viewmat and K need no gradient (ours never do), the twin otherwise."""
    if viewmat.requires_grad or K.requires_grad or means.dim() != 2 or means.dtype != viewmat.dtype:
        return raster_torch.project(means, quats, scales, viewmat, K, width, height, near_plane, far_plane, eps2d,
                                    antialiased, tile_mask, tile_size)
    dtype = means.dtype
    mask = torch.empty(0, dtype=torch.bool) if tile_mask is None else tile_mask.reshape(-1).to(torch.bool).contiguous()
    radii, means2d, depths, conics, compensations = _Project.apply(
        means.contiguous(), quats.to(dtype).contiguous(), scales.to(dtype).contiguous(), viewmat.contiguous(),
        K.to(dtype).contiguous(), int(width), int(height), float(near_plane), float(far_plane), float(eps2d),
        bool(antialiased), mask, int(tile_size),
    )
    return (radii, means2d, depths, conics, compensations) if antialiased else (radii, means2d, depths, conics)


class _SphericalHarmonics(torch.autograd.Function):
    """sh_cpu.cpp's forward and its written-out backward (to the directions and both parts of
    the coefficients: the DC term and the rest)."""

    @staticmethod
    def forward(ctx, degree, dirs, sh0, rest, masks):
        ctx.save_for_backward(dirs, sh0, rest, masks)
        ctx.degree = degree
        return native_module().sh_forward(degree, dirs, sh0, rest, masks)

    @staticmethod
    def backward(ctx, grad):
        dirs, sh0, rest, masks = ctx.saved_tensors
        g_dirs, g_sh0, g_rest = native_module().sh_backward(ctx.degree, dirs, sh0, rest, masks, grad.contiguous())
        wanted = ctx.needs_input_grad
        return (None, g_dirs if wanted[1] else None, g_sh0 if wanted[2] else None, g_rest if wanted[3] else None,
                None)


def spherical_harmonics(degree: int, dirs: Tensor, coeffs: Tensor, masks: Optional[Tensor] = None) -> Tensor:
    """Same inputs, output and rules as `raster_torch.spherical_harmonics` (dirs [N, 3],
    coeffs [N, K, 3], masks [N] bool or None): in C++ for degrees 0-3 and these shapes, the
    twin otherwise (degree 4, batch dimensions), which only our own tools ask for."""
    num_bases = (degree + 1) ** 2
    if num_bases > coeffs.shape[-2]:
        raise ValueError(f"SH degree {degree} needs {num_bases} coefficients, got {coeffs.shape[-2]}")
    if degree > 3 or dirs.dim() != 2 or coeffs.dim() != 3 or coeffs.shape[-1] != 3:
        return raster_torch.spherical_harmonics(degree, dirs, coeffs, masks)
    return spherical_harmonics_parts(degree, dirs, coeffs[:, :1], coeffs[:, 1:num_bases], masks)


def spherical_harmonics_parts(degree: int, dirs: Tensor, sh0: Tensor, rest: Tensor,
                              masks: Optional[Tensor] = None) -> Tensor:
    """`spherical_harmonics` of the coefficients cat([sh0, rest], 1), read where they lie: the
    C++ reads both parts and writes both gradients, so that a training step neither copies the
    coefficients together nor the gradient apart (three passes over them at degree 3). A
    masked-out row costs nothing, forward or backward: the renderer masks what it culled."""
    if (degree + 1) ** 2 > 1 + rest.shape[-2]:
        raise ValueError(f"SH degree {degree} needs {(degree + 1) ** 2} coefficients, got {1 + rest.shape[-2]}")
    if degree > 3 or dirs.dim() != 2 or sh0.dim() != 3 or rest.dim() != 3:
        return raster_torch.spherical_harmonics_parts(degree, dirs, sh0, rest, masks)
    dtype = sh0.dtype
    keep = torch.empty(0, dtype=torch.bool) if masks is None else masks.to(torch.bool).contiguous()
    return _SphericalHarmonics.apply(int(degree), dirs.to(dtype).contiguous(), sh0.contiguous(),
                                     rest.to(dtype).contiguous(), keep)


@torch.no_grad()
def intersect_tiles(
    means2d: Tensor,
    radii: Tensor,
    depths: Tensor,
    tile_size: int,
    tile_width: int,
    tile_height: int,
    tile_mask: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """Same inputs and outputs as `raster_torch.intersect_tiles`, bit for bit."""
    mask = torch.empty(0, dtype=torch.bool) if tile_mask is None else tile_mask.reshape(-1)
    offsets, flatten_ids = native_module().intersect_tiles(
        means2d.detach(), radii, depths.detach(), int(tile_size), int(tile_width), int(tile_height), mask
    )
    return offsets, flatten_ids
