"""Pure-PyTorch twins of the TurboGS kernels in cuda/.

They are the reference the CUDA kernels are tested against, and the path used without a
GPU. Every formula here is mirrored line by line in cuda/error_memory.cu and
cuda/tile_loss.cu; change both together.

Error memory layout: `errors` [V, T_max] float32, one row per training view, T_max the
largest tile count of any view. A view's tiles are row-major ids 0..T_v-1; entries
T_v..T_max-1 are padding and never read. +inf means "never rendered".

Sampling is Gumbel-top-k: the caller draws uniforms u in [0, 1); each candidate gets
the key log(weight) + G(u), G(u) = -log(-log(u)). The argmax of the keys is a draw with
probability proportional to the weights, and the top k keys are k draws without
replacement. Candidates that were never seen get UNSEEN_KEY + G(u) instead, which is above
every possible weighted key, so they are taken first, in uniformly random order.
"""

from __future__ import annotations

import torch
from torch import Tensor

from turbogs.tiles import gather_tiles

# log(weight) lies in [log(TINY), log(max error)] ~ [-46, 40] and G(u) in [-3.4, 16.7]
# for the clamped u, so unseen keys (UNSEEN_KEY + G) always sort above seen ones.
UNSEEN_KEY = 1000.0
TINY = 1e-20  # keeps log(weight) finite when an error and its floor are both 0
U_MIN, U_MAX = 1e-12, 0.99999994  # the largest float32 below 1


def gumbel(uniforms: Tensor) -> Tensor:
    u = uniforms.clamp(U_MIN, U_MAX)
    return -torch.log(-torch.log(u))


# --- error memory ----------------------------------------------------------------------


def memory_update(errors: Tensor, view, num_tiles: int, tile_ids: Tensor, tile_errors: Tensor,
                  decay: float) -> None:
    """In place: errors[view, t] <- x on the first observation, else decay * e + (1 - decay) * x.
    Ids outside [0, num_tiles) and non-finite errors are ignored. Ids must be unique."""
    x = tile_errors.detach().to(errors.dtype)
    in_grid = (tile_ids >= 0) & (tile_ids < num_tiles)
    ok = in_grid & torch.isfinite(x)
    # No boolean index (its size would need a host read): every id is written, ids outside the
    # grid into a spare slot past the view's tiles, and the ignored ones with their old value.
    full = errors.index_select(0, view.reshape(1))[0] if torch.is_tensor(view) else errors[view]
    row = torch.cat([full[:num_tiles], errors.new_zeros(1)])
    ids = torch.where(in_grid, tile_ids, num_tiles)
    old = row[ids]
    row[ids] = torch.where(ok, torch.where(torch.isinf(old), x, decay * old + (1.0 - decay) * x), old)
    if torch.is_tensor(view):  # a device index (indexing by a 0-d tensor would read it back)
        errors.index_copy_(0, view.reshape(1), torch.cat([row[:num_tiles], full[num_tiles:]])[None])
    else:
        errors[view, :num_tiles] = row[:num_tiles]


def view_sample_keys(errors: Tensor, tile_counts: Tensor, view_floor: float, uniforms: Tensor) -> Tensor:
    """Gumbel keys [V] for picking a view.

    A view with unseen tiles gets UNSEEN_KEY + G. Otherwise its weight is its mean tile
    error m_v (over seen tiles) plus view_floor times the mean of m over all views."""
    num_views, max_tiles = errors.shape
    in_view = torch.arange(max_tiles, device=errors.device)[None, :] < tile_counts[:, None]
    unseen = in_view & torch.isinf(errors)
    seen = in_view & ~torch.isinf(errors)
    seen_count = seen.sum(dim=1).to(errors.dtype)
    seen_sum = torch.where(seen, errors, torch.zeros_like(errors)).sum(dim=1)
    mean = torch.where(seen_count > 0, seen_sum / seen_count.clamp_min(1.0), torch.zeros_like(seen_sum))
    weight = mean + view_floor * mean.mean() + TINY
    g = gumbel(uniforms)
    return torch.where(unseen.any(dim=1), UNSEEN_KEY + g, torch.log(weight) + g)


def tile_sample_keys(errors_row: Tensor, gamma: float, tile_floor: float, uniforms: Tensor) -> Tensor:
    """Gumbel keys [T_v] for picking tiles of one view (errors_row = errors[view, :T_v]).

    A seen tile's weight is e^gamma plus tile_floor times the mean of e^gamma over the
    view's seen tiles; unseen tiles get UNSEEN_KEY + G."""
    seen = ~torch.isinf(errors_row)
    powered = torch.where(seen, errors_row.clamp_min(0.0).pow(gamma), torch.zeros_like(errors_row))
    seen_count = seen.sum().to(errors_row.dtype)
    mean = torch.where(seen_count > 0, powered.sum() / seen_count.clamp_min(1.0), torch.zeros_like(seen_count))
    g = gumbel(uniforms)
    return torch.where(seen, torch.log(powered + tile_floor * mean + TINY) + g, UNSEEN_KEY + g)


# --- tile loss -------------------------------------------------------------------------


def _safe_div(num: Tensor, den: Tensor) -> Tensor:
    """num / den where den > 0, else 0 (an empty block or tile)."""
    positive = den > 0
    return torch.where(positive, num / torch.where(positive, den, torch.ones_like(den)), torch.zeros_like(num))


def _to_blocks(x: Tensor, patch: int) -> Tensor:
    """[K, ts, ts, C] -> [K, Q, patch*patch, C], Q blocks per tile in row-major block order."""
    k, ts, _, c = x.shape
    q = ts // patch
    return x.reshape(k, q, patch, q, patch, c).permute(0, 1, 3, 2, 4, 5).reshape(k, q * q, patch * patch, c)


def block_moments(r: Tensor, g: Tensor, w: Tensor, patch: int):
    """Weighted first and centred second moments of each block, per channel.

    r, g: [K, ts, ts, 3] (zero where w == 0); w: [K, ts, ts]. Returns n [K, Q] (weight
    sums) and mu_r, mu_g, var_r, var_g, cov, each [K, Q, 3] (population statistics)."""
    rb, gb, wb = _to_blocks(r, patch), _to_blocks(g, patch), _to_blocks(w[..., None], patch)
    n = wb.sum(dim=2)  # [K, Q, 1]
    mu_r = _safe_div((wb * rb).sum(dim=2), n)
    mu_g = _safe_div((wb * gb).sum(dim=2), n)
    dr = rb - mu_r[:, :, None, :]
    dg = gb - mu_g[:, :, None, :]
    var_r = _safe_div((wb * dr * dr).sum(dim=2), n)
    var_g = _safe_div((wb * dg * dg).sum(dim=2), n)
    cov = _safe_div((wb * dr * dg).sum(dim=2), n)
    return n[..., 0], mu_r, mu_g, var_r, var_g, cov


def ssim_from_moments(mu_r, mu_g, var_r, var_g, cov, c1: float, c2: float) -> Tensor:
    a1 = 2.0 * mu_r * mu_g + c1
    a2 = 2.0 * cov + c2
    b1 = mu_r * mu_r + mu_g * mu_g + c1
    b2 = var_r + var_g + c2
    return (a1 * a2) / (b1 * b2)


def ncc_from_moments(var_r, var_g, cov, eps: float) -> Tensor:
    """One correlation over the 3 channels of a block, each centred on its own mean."""
    a = cov.sum(dim=-1)
    b = var_r.sum(dim=-1)
    c = var_g.sum(dim=-1)
    return (a + eps) / torch.sqrt((b + eps) * (c + eps))


def ncc_confidence(var_g: Tensor, std_ref: float) -> Tensor:
    """clamp(RMS channel std of the ground truth / std_ref, 0, 1): 0 on flat GT blocks."""
    std = torch.sqrt(var_g.detach().sum(dim=-1) / 3.0)
    return (std / std_ref).clamp(0.0, 1.0)


def tile_loss_per_tile(render: Tensor, gt: Tensor, tile_ids: Tensor, mask, params):
    """Per-tile loss L_i [K] and counted-pixel weight N_i [K] (see turbogs.turbo.losses)."""
    ts = params.tile_size
    r, valid = gather_tiles(render, tile_ids, ts)
    g, _ = gather_tiles(gt, tile_ids, ts)
    w = valid.to(render.dtype)
    if mask is not None:
        m, _ = gather_tiles(mask[..., None], tile_ids, ts)
        w = w * m[..., 0]
    counted = (w > 0)[..., None]
    # torch.where, not multiplication: uncounted pixels may hold NaN (masked or undefined).
    r = torch.where(counted, r, torch.zeros_like(r))
    g = torch.where(counted, g, torch.zeros_like(g))
    w = torch.where(counted[..., 0], w, torch.zeros_like(w))

    n_tile = w.sum(dim=(1, 2))
    l1_sum = (w * (r - g).abs().sum(dim=-1) / 3.0).sum(dim=(1, 2))

    n, mu_r, mu_g, var_r, var_g, cov = block_moments(r, g, w, params.ssim_patch)
    ssim = ssim_from_moments(mu_r, mu_g, var_r, var_g, cov, params.ssim_c1, params.ssim_c2)
    ssim_sum = (n * ssim.mean(dim=-1)).sum(dim=1)

    n, _, _, var_r, var_g, cov = block_moments(r, g, w, params.ncc_patch)
    ncc = ncc_from_moments(var_r, var_g, cov, params.ncc_eps)
    confidence = ncc_confidence(var_g, params.ncc_std_ref)
    ncc_sum = (n * confidence * (1.0 - ncc)).sum(dim=1)

    total = l1_sum + params.lambda_ssim * (n_tile - ssim_sum) + params.lambda_ncc * ncc_sum
    return _safe_div(total, n_tile), n_tile


def tile_loss(render: Tensor, gt: Tensor, tile_ids: Tensor, mask, params):
    """(loss, tile_errors [K] detached): the counted-pixel-weighted mean of the tile losses."""
    per_tile, weight = tile_loss_per_tile(render, gt, tile_ids, mask, params)
    loss = _safe_div((weight * per_tile).sum(), weight.sum())
    return loss, per_tile.detach()
