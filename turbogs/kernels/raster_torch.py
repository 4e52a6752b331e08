"""The pure-PyTorch rasterization chain: the CPU path and the oracle for the CUDA one.

Every function mirrors one of gsplat 1.5.3's CUDA ops for a single camera, with the same
conventions, so that `turbogs.kernels` can pick either by device:

- `project`: EWA splatting of 3D Gaussians (gsplat's `fully_fused_projection`),
- `spherical_harmonics`: view-dependent color,
- `intersect_tiles`: tile/Gaussian pairs sorted by (tile, depth), vectorized
  (gsplat's `_torch_impl._isect_tiles` is a Python loop, far too slow to train with),
- `rasterize`: front-to-back alpha compositing, tile by tile, differentiable through a
  hand-written backward (gsplat's own torch rasterizer needs CUDA).

All of them work on whatever device their inputs are on; `turbogs.kernels` sends them CPU
tensors. tests/test_render.py checks them against per-pixel brute force with autograd.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from turbogs.kernels.projection_torch import covariance, perspective_projection, world_to_camera
from turbogs.kernels.projection_torch import spherical_harmonics as _spherical_harmonics
from turbogs.tiles import TILE_SIZE, boxes_touch_tiles

# The constants of gsplat's CUDA kernels.
RADIUS_EXTENT = 3.33  # a Gaussian's screen radius, in standard deviations
ALPHA_THRESHOLD = 1.0 / 255.0  # fainter contributions are skipped
MAX_ALPHA = 0.999  # one Gaussian never makes a pixel fully opaque
MIN_TRANSMITTANCE = 1e-4  # a pixel stops once it would become this opaque
# The largest float32 below ALPHA_THRESHOLD: "x > it" is "x >= ALPHA_THRESHOLD".
_BELOW_ALPHA_THRESHOLD = float(torch.nextafter(torch.tensor(ALPHA_THRESHOLD), torch.tensor(0.0)))

# Tiles are composited in square blocks of this many pixels a side, each with only the
# Gaussians that can reach it: smaller blocks waste less work on far-away Gaussians,
# larger ones have less bookkeeping. 8 halves the work of 16 on typical scenes.
BLOCK_SIZE = 8
# Elements (blocks x pixels x Gaussians) of one compositing chunk: each [blocks, P, K]
# temporary then takes 2 MB in float32 and stays in cache, which is faster than larger
# chunks (measured: 2^18..2^20 best, 2^22 1.5x slower).
CHUNK_ELEMENTS = 1 << 19
# A chunk takes blocks down to this fraction of its largest Gaussian count.
PADDING_RATIO = 0.75


# --- projection -------------------------------------------------------------------


def project(
    means: Tensor,
    quats: Tensor,
    scales: Tensor,
    viewmat: Tensor,
    K: Tensor,
    width: int,
    height: int,
    near_plane: float,
    far_plane: float,
    eps2d: float,
    antialiased: bool = False,
    tile_mask: Optional[Tensor] = None,
    tile_size: int = TILE_SIZE,
):
    """Project Gaussians into one pinhole camera.

    Returns radii [N, 2] int32, means2d [N, 2], depths [N], conics [N, 3]. Culled
    Gaussians (outside near/far, degenerate, or off the image) get radii 0 and zeros
    elsewhere, as the CUDA backend reports them. With `tile_mask` [TH, TW], so are those
    whose screen box reaches none of its tiles (`tiles.boxes_touch_tiles`): a step that
    renders a quarter of the tiles then evaluates SH, sorts and differentiates only the
    Gaussians it can see. With `antialiased`, also the opacity compensations [N] of
    Mip-Splatting's 2D filter (`opacity_compensation`).
    """
    means_c, covars_c = world_to_camera(means, covariance(quats, scales), viewmat)
    depths = means_c[:, 2]
    in_depth = (depths >= near_plane) & (depths <= far_plane)
    # Gaussians outside the depth range are projected from a harmless stand-in point, so
    # that one at the camera's plane cannot put inf * 0 = NaN into the gradients.
    stand_in = torch.tensor([0.0, 0.0, 1.0], dtype=means.dtype, device=means.device)
    means_c = torch.where(in_depth[:, None], means_c, stand_in)
    means2d, cov2d = perspective_projection(means_c, covars_c, K, width, height)

    # Low-pass filter: every splat covers at least about a pixel.
    var_x = cov2d[:, 0, 0] + eps2d
    var_y = cov2d[:, 1, 1] + eps2d
    cov_xy = 0.5 * (cov2d[:, 0, 1] + cov2d[:, 1, 0])
    det = var_x * var_y - cov_xy * cov_xy

    with torch.no_grad():
        radius = torch.ceil(RADIUS_EXTENT * torch.stack([var_x, var_y], dim=-1).clamp_min(0).sqrt())
        visible = in_depth & (det > 0)
        visible &= (means2d[:, 0] + radius[:, 0] > 0) & (means2d[:, 0] - radius[:, 0] < width)
        visible &= (means2d[:, 1] + radius[:, 1] > 0) & (means2d[:, 1] - radius[:, 1] < height)
        radii = torch.where(visible[:, None], radius, 0).int()
        if tile_mask is not None:
            visible &= boxes_touch_tiles(means2d, radii, tile_mask, width, height, tile_size)
            radii = torch.where(visible[:, None], radii, 0)

    safe_det = torch.where(visible, det, torch.ones_like(det))
    conics = torch.stack([var_y / safe_det, -cov_xy / safe_det, var_x / safe_det], dim=-1)
    projected = zero_culled(radii, means2d, depths, conics, visible)
    if not antialiased:
        return projected
    det_orig = cov2d[:, 0, 0] * cov2d[:, 1, 1] - cov_xy * cov_xy
    compensation = opacity_compensation(det_orig, safe_det)
    return projected + (torch.where(visible, compensation, torch.zeros_like(compensation)),)


def opacity_compensation(det_orig: Tensor, det_blurred: Tensor) -> Tensor:
    """Mip-Splatting's 2D filter keeps a splat's energy: blurring the screen covariance by
    eps2d widens the Gaussian, so its peak opacity is scaled by sqrt(det(cov) / det(cov +
    eps2d I)) <= 1, the ratio of the two normalisations. A splat much larger than a pixel
    keeps its opacity (ratio ~1); one smaller than a pixel (seen from far away) is dimmed
    instead of thickened, which is what removes the aliasing. Floored at 1e-12 under the
    root so that a degenerate (flat) splat gets a finite gradient."""
    return torch.sqrt(torch.clamp_min(det_orig / det_blurred, 1e-12))


def zero_culled(radii: Tensor, means2d: Tensor, depths: Tensor, conics: Tensor, visible: Tensor):
    """Culled Gaussians report zeros (gsplat leaves them uninitialised), on both backends."""
    zero = torch.zeros((), dtype=means2d.dtype, device=means2d.device)
    return (
        radii,
        torch.where(visible[:, None], means2d, zero),
        torch.where(visible, depths, zero),
        torch.where(visible[:, None], conics, zero),
    )


def spherical_harmonics(degree: int, dirs: Tensor, coeffs: Tensor, masks: Optional[Tensor] = None) -> Tensor:
    """Raw SH value [N, 3] along `dirs` (normalized inside); the caller adds 0.5. With `masks`
    [N] bool (gsplat's argument), rows where it is False are 0 and pass no gradient back."""
    values = _spherical_harmonics(degree, dirs, coeffs)
    if masks is None:
        return values
    return torch.where(masks[..., None], values, torch.zeros((), dtype=values.dtype, device=values.device))


def spherical_harmonics_parts(degree: int, dirs: Tensor, sh0: Tensor, rest: Tensor,
                              masks: Optional[Tensor] = None) -> Tensor:
    """`spherical_harmonics` of the coefficients in the two parts Gaussians store them in, the
    DC term sh0 [N, 1, 3] and the rest [N, R, 3] (its first (degree + 1)^2 - 1 are used)."""
    return spherical_harmonics(degree, dirs, torch.cat([sh0, rest[:, : (degree + 1) ** 2 - 1]], dim=1), masks)


# --- tile intersection ------------------------------------------------------------


def _depth_sort_keys(depths: Tensor) -> Tensor:
    """gsplat sorts by the float32 bit pattern read as an unsigned int. That is the
    numeric order for positive depths, and it decides ties and negatives the same way."""
    return depths.float().contiguous().view(torch.int32).long() & 0xFFFFFFFF


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
    """All (tile, Gaussian) pairs whose tile overlaps the Gaussian's screen box, sorted by
    tile, then depth, then Gaussian index (gsplat's stable radix sort gives the same order).

    Returns isect_offsets [TH, TW] int32 (start of each tile's run in flatten_ids) and
    flatten_ids [M] int32 (Gaussian index of each pair). With `tile_mask`, pairs of
    unselected tiles are dropped.
    """
    device = means2d.device
    visible_ids = torch.nonzero((radii > 0).all(dim=-1)).squeeze(1)
    # Sort the visible Gaussians by depth once; pairs then inherit that order.
    depth_order = torch.sort(_depth_sort_keys(depths[visible_ids]), stable=True).indices
    ids = visible_ids[depth_order]

    # The tile box of each Gaussian, computed in float32 as the CUDA kernel does:
    # [min, max) in tile units, clamped to the grid.
    center = means2d.detach()[ids].float() / tile_size
    extent = radii[ids].float() / tile_size
    limit = torch.tensor([tile_width, tile_height], device=device)
    tile_min = torch.minimum(torch.floor(center - extent).clamp_min(0), limit).long()
    tile_max = torch.minimum(torch.ceil(center + extent).clamp_min(0), limit).long()
    box_w = tile_max[:, 0] - tile_min[:, 0]
    box_h = tile_max[:, 1] - tile_min[:, 1]
    tiles_per_gauss = box_w * box_h

    # Expand each Gaussian into its tiles, row by row.
    rank = torch.repeat_interleave(torch.arange(ids.numel(), device=device), tiles_per_gauss)
    first_pair = torch.cumsum(tiles_per_gauss, 0) - tiles_per_gauss
    local = torch.arange(rank.numel(), device=device) - first_pair[rank]
    tile_x = tile_min[rank, 0] + local % box_w[rank]
    tile_y = tile_min[rank, 1] + local // box_w[rank]
    tile_ids = tile_y * tile_width + tile_x

    if tile_mask is not None:
        keep = tile_mask.reshape(-1).to(device=device, dtype=torch.bool)[tile_ids]
        rank, tile_ids = rank[keep], tile_ids[keep]

    # The depth rank is unique, so one sort of (tile, rank) gives the final order.
    order = torch.argsort(tile_ids * max(ids.numel(), 1) + rank)
    tile_ids, flatten_ids = tile_ids[order], ids[rank[order]]

    counts = torch.bincount(tile_ids, minlength=tile_width * tile_height)
    offsets = torch.cumsum(counts, 0) - counts
    return offsets.reshape(tile_height, tile_width).int(), flatten_ids.int()


# --- rasterization ----------------------------------------------------------------


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
    """Front-to-back alpha compositing with gsplat's rules. Returns colors [H, W, C] and
    alphas [H, W, 1].

    Only tiles selected by `tile_mask` (all when None) are composited; the pixels of the
    others stay zero and receive no gradient. Each tile is split into blocks of
    BLOCK_SIZE^2 pixels that keep only the Gaussians able to reach them (see
    `_block_lists`), and blocks are composited in chunks as dense
    [blocks, pixels, Gaussians] tensors.
    """
    tile_height, tile_width = isect_offsets.shape
    channels = colors.shape[-1]
    device, dtype = means2d.device, colors.dtype
    block = BLOCK_SIZE if tile_size % BLOCK_SIZE == 0 else tile_size
    blocks_per_tile = (tile_size // block) ** 2

    if tile_mask is None:
        tiles = torch.arange(tile_width * tile_height, device=device)
    else:
        tiles = torch.nonzero(tile_mask.reshape(-1).to(device)).squeeze(1)
    starts, counts, gauss_ids = _block_lists(
        means2d, conics, opacities, tile_size, block, tile_width, isect_offsets, flatten_ids, tiles
    )
    # Blocks with the most Gaussians first, so each chunk pads to a count close to its own.
    order = torch.sort(counts, descending=True, stable=True).indices

    pieces: List[Tensor] = []
    for begin, end in _chunks(counts[order].tolist(), block * block):
        chunk_blocks = order[begin:end]
        pieces.append(
            _composite_blocks(
                chunk_blocks, starts[chunk_blocks], counts[chunk_blocks], gauss_ids,
                means2d, conics, colors, opacities, background, tile_size, tile_width, block, tiles,
            )
        )

    # Scatter the composited blocks into a zero canvas of whole tiles, then crop.
    canvas = torch.zeros(tile_height * tile_width * blocks_per_tile, block * block, channels + 1,
                         dtype=dtype, device=device)
    if pieces:
        rendered = (tiles[:, None] * blocks_per_tile + torch.arange(blocks_per_tile, device=device)).reshape(-1)
        canvas = canvas.index_copy(0, rendered[order], torch.cat(pieces))
    per_side = tile_size // block
    image = (
        canvas.reshape(tile_height, tile_width, per_side, per_side, block, block, channels + 1)
        .permute(0, 2, 4, 1, 3, 5, 6)
        .reshape(tile_height * tile_size, tile_width * tile_size, channels + 1)[:height, :width]
    )
    return image[..., :channels], image[..., channels:]


@torch.no_grad()
def _block_lists(
    means2d: Tensor,
    conics: Tensor,
    opacities: Tensor,
    tile_size: int,
    block: int,
    tile_width: int,
    isect_offsets: Tensor,
    flatten_ids: Tensor,
    tiles: Tensor,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Split each tile's depth-sorted Gaussians into per-block lists.

    A Gaussian reaches a pixel only where opacity * exp(-sigma) >= ALPHA_THRESHOLD, an
    ellipse whose bounding box we know in closed form. Dropping the Gaussians whose box
    misses a block changes no pixel, and it halves the work of typical scenes.
    Blocks are numbered `tile_index * blocks_per_tile + row * per_side + col`, with
    tile_index the position in `tiles`. Returns each block's start and count in
    gauss_ids, and gauss_ids (Gaussian indices, in depth order within each block).
    """
    device = means2d.device
    per_side = tile_size // block
    starts = isect_offsets.reshape(-1).long()
    counts = torch.diff(starts, append=torch.tensor([flatten_ids.numel()], device=device))

    # Every pair of the selected tiles, in (tile, depth) order.
    pair_tile = torch.repeat_interleave(torch.arange(tiles.numel(), device=device), counts[tiles])
    first = torch.cumsum(counts[tiles], 0) - counts[tiles]
    pair_pos = torch.arange(pair_tile.numel(), device=device) - first[pair_tile] + starts[tiles][pair_tile]
    gauss = flatten_ids[pair_pos].long()

    # Half-extents of each Gaussian's alpha >= ALPHA_THRESHOLD ellipse, with a margin for
    # rounding; unbounded when the conic is not positive definite.
    a, b, c = conics.detach()[gauss].unbind(-1)
    det = a * c - b * b
    level = torch.log(opacities.detach()[gauss] / ALPHA_THRESHOLD).clamp_min(0)
    positive = (a > 0) & (det > 0)
    safe_det = torch.where(positive, det, torch.ones_like(det))
    reach_x = torch.where(positive, torch.sqrt(2 * level * c / safe_det) * 1.001 + 0.01, torch.inf)
    reach_y = torch.where(positive, torch.sqrt(2 * level * a / safe_det) * 1.001 + 0.01, torch.inf)

    # First and last pixel centers of each block column / row of the pair's tile.
    tile_id = tiles[pair_tile]
    offsets = torch.arange(per_side, device=device) * block + 0.5
    first_x = (tile_id % tile_width * tile_size)[:, None] + offsets  # [M, per_side]
    first_y = (tile_id // tile_width * tile_size)[:, None] + offsets
    xy = means2d.detach()[gauss]
    hits_x = (xy[:, :1] + reach_x[:, None] >= first_x) & (xy[:, :1] - reach_x[:, None] <= first_x + block - 1)
    hits_y = (xy[:, 1:] + reach_y[:, None] >= first_y) & (xy[:, 1:] - reach_y[:, None] <= first_y + block - 1)
    pair, row, col = torch.nonzero(hits_y[:, :, None] & hits_x[:, None, :], as_tuple=True)

    # Group by block; the pair index keeps depth order within a block.
    block_id = pair_tile[pair] * per_side * per_side + row * per_side + col
    order = torch.argsort(block_id * max(pair_tile.numel(), 1) + pair)
    block_counts = torch.bincount(block_id, minlength=tiles.numel() * per_side * per_side)
    block_starts = torch.cumsum(block_counts, 0) - block_counts
    return block_starts, block_counts, gauss[pair[order]]


def _chunks(sorted_counts: List[int], pixels: int) -> List[Tuple[int, int]]:
    """Split blocks, sorted by descending Gaussian count, into [begin, end) chunks that
    stay within CHUNK_ELEMENTS and whose counts are within PADDING_RATIO of their first
    (padding every block to the first's count then wastes little)."""
    chunks, begin = [], 0
    while begin < len(sorted_counts):
        widest = sorted_counts[begin]
        room = max(1, CHUNK_ELEMENTS // (pixels * max(widest, 1)))
        end = begin + 1
        while end < len(sorted_counts) and end - begin < room and sorted_counts[end] >= PADDING_RATIO * widest:
            end += 1
        chunks.append((begin, end))
        begin = end
    return chunks


def _composite_blocks(
    blocks: Tensor,  # [B] block numbers (see `_block_lists`)
    starts: Tensor,  # [B] first entry of each block in gauss_ids
    counts: Tensor,  # [B] Gaussians of each block
    gauss_ids: Tensor,
    means2d: Tensor,
    conics: Tensor,
    colors: Tensor,
    opacities: Tensor,
    background: Optional[Tensor],
    tile_size: int,
    tile_width: int,
    block: int,
    tiles: Tensor,
) -> Tensor:
    """Composite B blocks at once. Returns [B, P, C + 1]: colors, then alpha."""
    device, dtype = means2d.device, means2d.dtype
    slot = torch.arange(int(counts.max()) if counts.numel() else 0, device=device)
    in_run = slot < counts[:, None]  # [B, K]: padding slots are False
    entry = (starts[:, None] + slot).clamp_max(max(gauss_ids.numel() - 1, 0))
    gauss = torch.where(in_run, gauss_ids[entry], 0) if slot.numel() else entry  # [B, K]

    # Pixel centers of each block's columns (x) and rows (y): [B, block].
    per_side = tile_size // block
    tile_id = tiles[blocks // (per_side * per_side)]
    row, col = (blocks % (per_side * per_side)).div(per_side, rounding_mode="floor"), blocks % per_side
    centers = torch.arange(block, device=device, dtype=dtype) + 0.5
    pix_x = (tile_id % tile_width * tile_size + col * block).to(dtype)[:, None] + centers
    pix_y = (tile_id // tile_width * tile_size + row * block).to(dtype)[:, None] + centers

    # -sigma = -(a dx^2 + c dy^2) / 2 - b dx dy is an x-only term, a y-only term and a
    # cross term; each is computed per column or per row ([B, block, K]) and only their
    # sum on the full grid, inside _Composite.
    xy = means2d[gauss]  # [B, K, 2]
    a, b, c = conics[gauss].unbind(-1)  # [B, K] each
    dx = xy[:, None, :, 0] - pix_x[:, :, None]  # [B, cols, K]
    dy = xy[:, None, :, 1] - pix_y[:, :, None]  # [B, rows, K]
    x_term = (-0.5 * a[:, None] * dx * dx)[:, None]  # [B, 1, cols, K]
    y_term = (-0.5 * c[:, None] * dy * dy)[:, :, None]  # [B, rows, 1, K]
    cross = (-b[:, None] * dx)[:, None]  # [B, 1, cols, K]
    opacity = (opacities[gauss] * in_run)[:, None, :]  # [B, 1, K]; padding never counts
    positive_definite = bool(((a > 0) & (a * c - b * b > 0) | ~in_run).all())
    return _Composite.apply(
        x_term, y_term, cross, dy[:, :, None], opacity, colors[gauss], background, positive_definite
    )


class _Composite(torch.autograd.Function):
    """Alpha compositing of B blocks of pixels, each over its own K depth-sorted Gaussians.

    Inputs: the exponent in separable form, -sigma = x_term + y_term + cross * dy
    ([B, 1, cols, K], [B, rows, 1, K], [B, 1, cols, K], [B, rows, 1, K]), opacity
    [B, 1, K], colors [B, K, C], background [C] or None, and whether every conic is
    positive definite (then sigma >= 0 everywhere and that test can be skipped). Output
    [B, P, C + 1] with P = rows * cols row-major: the colors over the background, then alpha.

    The backward is written out: autograd's would be several times slower (cumprod's
    backward alone costs more than this whole forward) and would keep a dozen full-size
    tensors per chunk alive. With T_i the transmittance before Gaussian i and
    w_i = alpha_i T_i, for every Gaussian i that a pixel kept,
        d color / d alpha_i = T_i c_i - (sum_{j > i} w_j c_j + T_final bg) / (1 - alpha_i)
                            = (T_{i+1} c_i - sum_{j > i} w_j c_j - T_final bg) / (1 - alpha_i),
    where the output alpha is the channel with c = 1 and bg = 0. Clamped alphas
    (opacity * exp(-sigma) > MAX_ALPHA) pass no gradient, as in gsplat.
    Masks are applied with F.threshold: it is several times faster than torch.where.
    """

    @staticmethod
    def forward(ctx, x_term, y_term, cross, dy, opacity, colors, background, positive_definite):
        neg_sigma = torch.addcmul(x_term + y_term, cross, dy).flatten(1, 2)  # [B, P, K]
        raw = opacity * torch.exp(neg_sigma)
        # alpha = min(raw, MAX_ALPHA) where raw >= ALPHA_THRESHOLD, else 0.
        alpha = F.threshold(raw, _BELOW_ALPHA_THRESHOLD, 0.0).clamp_max_(MAX_ALPHA)
        if not positive_definite:
            alpha = alpha * (neg_sigma <= 0)
        one_minus = 1.0 - alpha
        # Transmittance after each Gaussian, zero from the one at which the pixel stops
        # (the product only falls, so the kept Gaussians are a prefix).
        t_after = F.threshold(torch.cumprod(one_minus, dim=-1), MIN_TRANSMITTANCE, 0.0)
        weights = t_after * alpha / one_minus  # alpha * T_before where kept, else 0
        rgb = torch.bmm(weights, colors)  # [B, P, C]
        acc = weights.sum(dim=-1, keepdim=True)  # 1 - final transmittance
        t_final = 1.0 - acc
        if background is not None:
            rgb = torch.addcmul(rgb, t_final, background)
        ctx.save_for_backward(dy, cross, opacity, colors, background, alpha, t_after, weights, t_final)
        return torch.cat([rgb, acc], dim=-1)

    @staticmethod
    def backward(ctx, grad_out):
        dy, cross, opacity, colors, background, alpha, t_after, weights, t_final = ctx.saved_tensors
        grad_rgb, grad_acc = grad_out[..., :-1], grad_out[..., -1:]
        # v_i: the output gradient seen through Gaussian i's color (alpha channel = 1).
        v = torch.baddbmm(grad_acc, grad_rgb, colors.transpose(1, 2))  # [B, P, K]
        prefix = torch.cumsum(weights * v, dim=-1)
        behind = prefix[..., -1:] - prefix  # sum over j > i; exactly 0 past the stop
        if background is not None:
            # T_final where kept (t_after >= T_final > 0), 0 past the stop.
            behind = torch.addcmul(behind, torch.minimum(t_after, t_final), (grad_rgb @ background)[..., None])
        minus_grad_alpha = (behind - t_after * v) / (1.0 - alpha)
        # -d alpha / d(-sigma) = -alpha where not clamped, else 0; alpha is 0 where skipped.
        minus_slope = F.threshold(-alpha, -MAX_ALPHA, 0.0)
        grad_neg_sigma = minus_grad_alpha * minus_slope  # [B, P, K]
        grad_opacity = grad_neg_sigma.sum(dim=1, keepdim=True)  # d alpha / d opacity = alpha / opacity
        grad_opacity = torch.where(opacity > 0, grad_opacity / opacity.clamp_min(1e-30), 0.0)

        grid = grad_neg_sigma.unflatten(1, (dy.shape[1], cross.shape[2]))  # [B, rows, cols, K]
        grad_x_term = grid.sum(dim=1, keepdim=True)
        grad_y_term = grid.sum(dim=2, keepdim=True)
        grad_cross = (grid * dy).sum(dim=1, keepdim=True)
        grad_dy = (grid * cross).sum(dim=2, keepdim=True)
        grad_colors = torch.bmm(weights.transpose(1, 2), grad_rgb)
        grad_background = None
        if background is not None and ctx.needs_input_grad[6]:
            grad_background = (t_final * grad_rgb).sum(dim=(0, 1))
        return grad_x_term, grad_y_term, grad_cross, grad_dy, grad_opacity, grad_colors, grad_background, None
