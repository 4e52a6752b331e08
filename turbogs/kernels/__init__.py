"""The one dispatch point: compiled kernel or its pure-PyTorch twin.

Every op below has two implementations with the same signature and semantics:
- a compiled one (gsplat's CUDA kernels for the rasterization chain, `turbogs._C` for ours,
  and on the CPU our C++ kernels, `raster_cpu`), and
- a readable torch twin that runs anywhere and is the test oracle.

The choice is made here, from the device of the inputs, and nowhere else: no other
module branches on the device. On CUDA a kernel that cannot be built or loaded is an error
(one line, exit 2), never a silent fallback: a "GPU figure" must not come from the twins.
On the CPU the native kernels (projection, SH, tile intersection, compositing, tile loss) are built on first use
(`prepare_kernels`, before the training clock starts); without a C++ compiler one line says
so and the twins run.
An explicit `--torch-twins` (use_torch_twins) runs TurboGS's own ops as twins on either
device; `backend_name()` says which ran, and results.json / bench.json record it.

    raster_torch.py      projection, SH, tile intersection, compositing: the torch twins
    projection_torch.py  their covariance / EWA / SH math (our copy of gsplat's reference)
    raster_gsplat.py     the same four ops as thin wrappers over gsplat's CUDA kernels
    raster_cpu.py        the same four ops in C++ on the CPU (cuda/cpu/, built just in time)
    turbo_torch.py       error memory, Gumbel sampling keys, tile loss: the torch twins
    turbo_cuda.py        the same over our kernels in turbogs._C (cuda/, built or JIT-compiled)
    turbo_cpu.py         the tile loss in C++ on the CPU (with raster_cpu's kernels), the rest twins

Tile geometry (TILE_SIZE, ids, masks) is turbogs/tiles.py; callers pass tile_size=TILE_SIZE.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from turbogs.kernels import raster_cpu, raster_gsplat, raster_torch, turbo_cpu, turbo_cuda, turbo_torch
from turbogs.tiles import TILE_SIZE

_twins = False  # --torch-twins: TurboGS's own ops run as their torch twins (CUDA and CPU)


def use_torch_twins(enabled: bool) -> None:
    """Ask for the torch twins of TurboGS's own ops (slower; to debug a kernel, or to time
    both paths side by side). On CUDA, gsplat's rasterization chain has no such switch: it is
    gsplat's or nothing; on the CPU the whole chain runs as the twins too."""
    global _twins
    _twins = bool(enabled)


def backend_name(device: torch.device) -> str:
    """What runs on `device`: on the CPU "cpu-native" (our C++ kernels) or "torch" (the
    twins: asked for, or no compiler); on CUDA "gsplat+turbogs._C" or "gsplat+twins"."""
    if torch.device(device).type != "cuda":
        return "cpu-native" if _native_cpu() else "torch"
    return "gsplat+twins" if _twins else "gsplat+turbogs._C"


def prepare_kernels(device: torch.device, log: Optional[Callable[[str], None]] = None) -> None:
    """Before the first timed step: on CUDA load every module a run will use (a failure is a
    TurboGSError); on the CPU build the native kernels unless the twins are asked for (a
    failure is one line through `log` and the twins run)."""
    if torch.device(device).type == "cuda":
        require_cuda_kernels()
    elif not _twins:
        raster_cpu.load(log)


def _native_cpu() -> bool:
    """Whether the CPU kernels run natively: not asked for the twins, and built (the first
    call builds them)."""
    return not _twins and raster_cpu.load()


def require_cuda_kernels() -> None:
    """Load (building if needed) every CUDA module a run will use, before its first step:
    a missing kernel is a one-line TurboGSError now, not a traceback minutes into training."""
    raster_gsplat.require()
    if not _twins:
        turbo_cuda.require()


def on_cuda(t: torch.Tensor) -> bool:
    return t.is_cuda


def _raster_backend(cuda: bool, dtype: torch.dtype = torch.float32):
    """The rasterization chain: gsplat's on CUDA, else the native CPU kernels (float32 /
    float64) when they are built and the twins are not asked for, else the twins."""
    if cuda:
        raster_gsplat.require()  # cached after the first call; a failed gsplat build is one clear error
        return raster_gsplat
    if dtype in (torch.float32, torch.float64) and _native_cpu():
        return raster_cpu
    return raster_torch


# --- the rasterization chain ------------------------------------------------------


def project(means, quats, scales, viewmat, K, width, height, near_plane=0.01, far_plane=1e10, eps2d=0.3,
            antialiased=False, tile_mask=None, tile_size=TILE_SIZE):
    """Project Gaussians into one camera; `quats` need not be normalized (every backend
    normalizes them).

    Returns radii [N, 2] int32 (0 where culled), means2d [N, 2], depths [N], conics [N, 3];
    with `antialiased` (gsplat's rasterize_mode="antialiased"), a fifth tensor: each
    Gaussian's opacity compensation [N] for the eps2d blur (0 where culled), which the
    caller multiplies into the opacities. With `tile_mask` [TH, TW], Gaussians that reach
    none of its tiles are culled too.
    """
    return _raster_backend(on_cuda(means), means.dtype).project(
        means, quats, scales, viewmat, K, width, height, near_plane, far_plane, eps2d, antialiased, tile_mask, tile_size
    )


def spherical_harmonics(degree, dirs, coeffs, masks=None):
    """Evaluate SH of `degree` along unit-or-not `dirs` [N, 3] with coeffs [N, K, 3] -> [N, 3].
    With `masks` [N] bool (gsplat's argument), rows where it is False are 0 and get no gradient."""
    return _raster_backend(on_cuda(coeffs), coeffs.dtype).spherical_harmonics(degree, dirs, coeffs, masks)


def spherical_harmonics_parts(degree, dirs, sh0, rest, masks=None):
    """`spherical_harmonics` of cat([sh0, rest], 1) (the DC term [N, 1, 3] and the higher bands
    [N, R, 3], as Gaussians store them), without the concatenation where the backend can."""
    return _raster_backend(on_cuda(sh0), sh0.dtype).spherical_harmonics_parts(degree, dirs, sh0, rest, masks)


def intersect_tiles(means2d, radii, depths, tile_size, tile_width, tile_height, tile_mask=None):
    """Tile/Gaussian pairs sorted by (tile, depth). With `tile_mask` [TH, TW] bool, pairs of
    unselected tiles are dropped. Returns isect_offsets [TH, TW] int32, flatten_ids [M] int32."""
    return _raster_backend(on_cuda(means2d)).intersect_tiles(
        means2d, radii, depths, tile_size, tile_width, tile_height, tile_mask
    )


def rasterize(means2d, conics, colors, opacities, width, height, tile_size, isect_offsets, flatten_ids,
              background=None, tile_mask=None):
    """Front-to-back alpha compositing. Returns colors [H, W, C] and alphas [H, W, 1].
    With `tile_mask`, the colors of unselected tiles' pixels are undefined and must not be
    read (zero on the CPU, the background on CUDA); their alphas are 0 on both.
    On the CPU: the native kernel (`raster_cpu`) when built, else the twin."""
    return _raster_backend(on_cuda(means2d), means2d.dtype).rasterize(
        means2d, conics, colors, opacities, width, height, tile_size, isect_offsets, flatten_ids,
        background, tile_mask,
    )


# --- TurboGS ops ---
# Error memory, tile sampling and the sparse tile loss: turbo_cuda (kernels of turbogs._C,
# built by setup.py or just-in-time) on CUDA float32 inputs; on the CPU turbo_cpu (the tile
# loss in C++, float32 / float64) when the CPU kernels are built; the twins in turbo_torch
# elsewhere (or with use_torch_twins). Semantics: see turbo_torch.


def _turbo_backend(cuda: bool):
    """On CUDA: turbogs._C (an error if it cannot be built) unless the twins are asked for."""
    if not cuda or _twins:
        return turbo_torch
    turbo_cuda.require()  # raises TurboGSError when turbogs._C cannot be built or loaded
    return turbo_cuda


def _turbo_for(t: torch.Tensor):
    if on_cuda(t):
        return _turbo_backend(t.dtype == torch.float32)
    if t.dtype in (torch.float32, torch.float64) and _native_cpu():
        return turbo_cpu
    return turbo_torch


def error_memory_update(errors, view, num_tiles, tile_ids, tile_errors, decay):
    """In place on errors [V, T_max]: row `view` takes tile_errors [K] at tile_ids [K]
    (first observation replaces +inf, later ones blend with EMA `decay`)."""
    return _turbo_for(errors).memory_update(errors, view, num_tiles, tile_ids, tile_errors, decay)


def view_sample_keys(errors, tile_counts, view_floor, uniforms):
    """Gumbel keys [V] whose argmax is the view to train on."""
    return _turbo_for(errors).view_sample_keys(errors, tile_counts, view_floor, uniforms)


def tile_sample_keys(errors_row, gamma, tile_floor, uniforms):
    """Gumbel keys [T_v] whose top k are the tiles to render."""
    return _turbo_for(errors_row).tile_sample_keys(errors_row, gamma, tile_floor, uniforms)


def tile_loss(render, gt, tile_ids, mask, params):
    """(loss, tile_errors [K]) of the sampled tiles; `params` is a turbogs.turbo.losses.LossConfig."""
    return _turbo_for(render).tile_loss(render, gt, tile_ids, mask, params)
