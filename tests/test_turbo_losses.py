"""The tile-wise loss (turbogs.turbo.losses) against numpy loops: the twin (kernels.turbo_torch)
and, where a C++ compiler is, the CPU kernel (kernels.turbo_cpu), every test on both."""

import math

import numpy as np
import pytest
import torch

from turbogs import kernels
from turbogs.errors import TurboGSError
from turbogs.kernels import raster_cpu
from turbogs.kernels import turbo_torch as _torch_impl
from turbogs.tiles import gather_tiles, tile_grid, tile_pixel_index
from turbogs.turbo.losses import LossConfig, TileLoss

@pytest.fixture(autouse=True, params=["twin", "native"])
def backend(request):
    """TileLoss dispatches to the native CPU kernel unless the twins are asked for."""
    if request.param == "native" and not raster_cpu.load():
        pytest.skip("TurboGS's CPU kernels are not built here (no C++ compiler)")
    kernels.use_torch_twins(request.param == "twin")
    yield request.param
    kernels.use_torch_twins(False)


# --- an independent reference: explicit loops over tiles, blocks and pixels -------------


def np_block_terms(r, g, w, cfg):
    """SSIM (channel mean) and NCC of one block from its pixel lists: r, g [P, 3], w [P]."""
    n = w.sum()
    mu_r = (w[:, None] * r).sum(0) / n
    mu_g = (w[:, None] * g).sum(0) / n
    var_r = (w[:, None] * (r - mu_r) ** 2).sum(0) / n
    var_g = (w[:, None] * (g - mu_g) ** 2).sum(0) / n
    cov = (w[:, None] * (r - mu_r) * (g - mu_g)).sum(0) / n
    c1, c2 = cfg.ssim_c1, cfg.ssim_c2
    ssim = ((2 * mu_r * mu_g + c1) * (2 * cov + c2)) / ((mu_r**2 + mu_g**2 + c1) * (var_r + var_g + c2))
    eps = cfg.ncc_eps
    ncc = (cov.sum() + eps) / math.sqrt((var_r.sum() + eps) * (var_g.sum() + eps))
    confidence = min(max(math.sqrt(var_g.sum() / 3) / cfg.ncc_std_ref, 0.0), 1.0)
    return n, ssim.mean(), ncc, confidence


def np_tile_losses(render, gt, tile_ids, mask, cfg):
    """Per-tile loss and counted weight, straight from the definitions in losses.py."""
    height, width = render.shape[:2]
    ts = cfg.tile_size
    tiles_x = -(-width // ts)
    losses, weights = [], []
    for tile in tile_ids:
        ty, tx = divmod(int(tile), tiles_x)

        def pixels(y0, x0, size):
            ys, xs, ws = [], [], []
            for y in range(y0, min(y0 + size, height)):
                for x in range(x0, min(x0 + size, width)):
                    weight = 1.0 if mask is None else float(mask[y, x])
                    if weight > 0:
                        ys.append(y), xs.append(x), ws.append(weight)
            return np.array(ys, dtype=int), np.array(xs, dtype=int), np.array(ws)

        ys, xs, ws = pixels(ty * ts, tx * ts, ts)
        n_tile = ws.sum()
        if n_tile == 0:
            losses.append(0.0), weights.append(0.0)
            continue
        l1 = (ws * np.abs(render[ys, xs] - gt[ys, xs]).mean(1)).sum() / n_tile
        ssim_sum = ncc_sum = 0.0
        for patch, kind in ((cfg.ssim_patch, "ssim"), (cfg.ncc_patch, "ncc")):
            for by in range(ts // patch):
                for bx in range(ts // patch):
                    bys, bxs, bws = pixels(ty * ts + by * patch, tx * ts + bx * patch, patch)
                    if bws.sum() == 0:
                        continue
                    n, ssim, ncc, conf = np_block_terms(render[bys, bxs], gt[bys, bxs], bws, cfg)
                    if kind == "ssim":
                        ssim_sum += n * ssim
                    else:
                        ncc_sum += n * conf * (1 - ncc)
        loss = l1 + cfg.lambda_ssim * (1 - ssim_sum / n_tile) + cfg.lambda_ncc * ncc_sum / n_tile
        losses.append(loss), weights.append(n_tile)
    return np.array(losses), np.array(weights)


def random_images(height, width, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    gt = torch.rand(height, width, 3, generator=gen, dtype=dtype)
    render = (gt + 0.2 * torch.randn(height, width, 3, generator=gen, dtype=dtype)).clamp(0, 1)
    return render, gt


# --- tile geometry ----------------------------------------------------------------------


def test_tile_pixel_index_matches_a_loop_on_partial_tiles():
    height, width, ts = 7, 10, 4  # 2 x 3 tiles; last row and column partial
    ids = torch.tensor([0, 2, 5, 6, -1])  # 6 and -1 lie outside the grid
    flat, valid = tile_pixel_index(ids, height, width, ts)
    for k, tile in enumerate(ids.tolist()):
        for ly in range(ts):
            for lx in range(ts):
                in_grid = 0 <= tile < 6
                y, x = (tile // 3) * ts + ly, (tile % 3) * ts + lx
                expect_valid = in_grid and y < height and x < width
                assert bool(valid[k, ly, lx]) == expect_valid
                if expect_valid:
                    assert int(flat[k, ly, lx]) == y * width + x
                assert 0 <= int(flat[k, ly, lx]) < height * width  # always safe to read
    image = torch.arange(height * width * 2, dtype=torch.float32).reshape(height, width, 2)
    values, valid2 = gather_tiles(image, ids, ts)
    assert torch.equal(valid, valid2)
    assert torch.equal(values[1][valid[1]], image[0:4, 8:10].reshape(-1, 2))


# --- single blocks: SSIM and NCC against direct numpy formulas ---------------------------


def test_ssim_of_one_block_matches_numpy():
    render, gt = random_images(8, 8, seed=1, dtype=torch.float64)
    w = torch.ones(1, 8, 8, dtype=torch.float64)
    n, mu_r, mu_g, var_r, var_g, cov = _torch_impl.block_moments(render[None], gt[None], w, 8)
    ssim = _torch_impl.ssim_from_moments(mu_r, mu_g, var_r, var_g, cov, 0.01**2, 0.03**2)[0, 0]
    r, g = render.reshape(-1, 3).numpy(), gt.reshape(-1, 3).numpy()
    for c in range(3):
        x, y = r[:, c], g[:, c]
        cov_xy = np.cov(x, y, bias=True)[0, 1]
        expected = ((2 * x.mean() * y.mean() + 1e-4) * (2 * cov_xy + 9e-4)) / (
            (x.mean() ** 2 + y.mean() ** 2 + 1e-4) * (x.var() + y.var() + 9e-4)
        )
        assert float(ssim[c]) == pytest.approx(expected, rel=1e-12)
    assert float(n[0, 0]) == 64


def test_ncc_of_one_block_is_pearson_of_channel_centred_pixels():
    render, gt = random_images(8, 8, seed=2, dtype=torch.float64)
    w = torch.ones(1, 8, 8, dtype=torch.float64)
    _, _, _, var_r, var_g, cov = _torch_impl.block_moments(render[None], gt[None], w, 8)
    ncc = float(_torch_impl.ncc_from_moments(var_r, var_g, cov, eps=1e-15)[0, 0])
    r, g = render.reshape(-1, 3).numpy(), gt.reshape(-1, 3).numpy()
    r, g = (r - r.mean(0)).ravel(), (g - g.mean(0)).ravel()  # centre each channel, then pool
    expected = (r @ g) / math.sqrt((r @ r) * (g @ g))
    assert ncc == pytest.approx(expected, rel=1e-9)


def test_ncc_is_one_for_affine_copies_and_flat_blocks():
    _, gt = random_images(8, 8, seed=3, dtype=torch.float64)
    w = torch.ones(1, 8, 8, dtype=torch.float64)
    for render, expected in ((gt, 1.0), (0.5 * gt + 0.2, None), (torch.full_like(gt, 0.3), None)):
        _, _, _, var_r, var_g, cov = _torch_impl.block_moments(render[None], gt[None], w, 8)
        ncc = float(_torch_impl.ncc_from_moments(var_r, var_g, cov, 1e-4)[0, 0])
        assert -1.0 <= ncc <= 1.0 + 1e-12
        if expected is not None:
            assert ncc == pytest.approx(expected, abs=1e-12)
    # A scaled copy is almost perfectly correlated (eps only shrinks it a little) ...
    _, _, _, var_r, var_g, cov = _torch_impl.block_moments((0.5 * gt + 0.2)[None], gt[None], w, 8)
    assert float(_torch_impl.ncc_from_moments(var_r, var_g, cov, 1e-4)[0, 0]) > 0.99
    # ... and two flat blocks agree perfectly.
    flat = torch.full((1, 8, 8, 3), 0.4, dtype=torch.float64)
    _, _, _, var_r, var_g, cov = _torch_impl.block_moments(flat, flat * 0.5, w, 8)
    assert float(_torch_impl.ncc_from_moments(var_r, var_g, cov, 1e-4)[0, 0]) == pytest.approx(1.0)


# --- whole tiles against the loop reference -----------------------------------------------


@pytest.mark.parametrize("ssim_patch,ncc_patch", [(8, 16), (16, 8), (4, 4)])
def test_tile_losses_match_loop_reference_with_partial_tiles_and_mask(ssim_patch, ncc_patch):
    height, width = 21, 35  # 2 x 3 tiles of 16: the last row and column are partial
    render, gt = random_images(height, width, seed=4, dtype=torch.float64)
    gen = torch.Generator().manual_seed(5)
    mask = (torch.rand(height, width, generator=gen, dtype=torch.float64) > 0.3).double()
    mask[:, :5] *= 0.5  # fractional weights too
    cfg = LossConfig(ssim_patch=ssim_patch, ncc_patch=ncc_patch, lambda_ncc=0.3)
    ids = torch.tensor([0, 2, 4, 5])
    for m in (None, mask):
        loss, tile_errors = TileLoss(cfg)(render, gt, ids, m)
        m_np = None if m is None else m.numpy()
        expected, weights = np_tile_losses(render.numpy(), gt.numpy(), ids.tolist(), m_np, cfg)
        np.testing.assert_allclose(tile_errors.numpy(), expected, rtol=1e-10, atol=1e-12)
        assert float(loss) == pytest.approx((expected * weights).sum() / weights.sum(), rel=1e-10)
    assert weights[2] == pytest.approx(float(mask[16:, 16:32].sum()))  # tile 4 = (1, 1): 5 valid rows


def test_identical_images_have_zero_loss_and_tile_errors_are_detached():
    render, gt = random_images(32, 32, seed=6)
    render = gt.clone().requires_grad_(True)
    loss, tile_errors = TileLoss()(render, gt, torch.arange(tile_grid(32, 32)[0] * tile_grid(32, 32)[1]))
    assert float(loss.detach()) < 1e-6
    assert not tile_errors.requires_grad
    assert tile_errors.shape == (4,)


def test_out_of_grid_and_fully_masked_tiles_add_nothing():
    render, gt = random_images(16, 32, seed=7)
    mask = torch.ones(16, 32)
    mask[:, 16:] = 0  # tile 1 fully masked
    loss_fn = TileLoss()
    loss_all, errors_all = loss_fn(render, gt, torch.tensor([0, 1, 7]), mask)
    loss_one, errors_one = loss_fn(render, gt, torch.tensor([0]), mask)
    assert float(loss_all) == pytest.approx(float(loss_one), rel=1e-6)
    assert errors_all[1:].tolist() == [0.0, 0.0]
    assert float(errors_all[0]) == pytest.approx(float(errors_one[0]), rel=1e-6)


# --- gradients -----------------------------------------------------------------------------


def test_gradcheck_float64_small_tiles():
    height, width = 10, 7  # tile 4: 3 x 2 tiles, partial on both edges
    render, gt = random_images(height, width, seed=8, dtype=torch.float64)
    gen = torch.Generator().manual_seed(9)
    mask = torch.rand(height, width, generator=gen, dtype=torch.float64)
    mask[mask < 0.2] = 0
    cfg = LossConfig(tile_size=4, ssim_patch=2, ncc_patch=4, lambda_ssim=0.5, lambda_ncc=0.5, ncc_std_ref=1.0)
    ids = torch.tensor([0, 3, 5])
    render.requires_grad_(True)
    for m in (None, mask):
        assert torch.autograd.gradcheck(lambda r: _torch_impl.tile_loss(r, gt, ids, m, cfg)[0], (render,))


def test_flat_ground_truth_tile_is_stable():
    """Flat GT: the NCC term vanishes (confidence 0), so it adds no gradient, and the
    gradients stay small and finite whether the render is flat or carries noise."""
    gt = torch.full((16, 16, 3), 0.5)
    gen = torch.Generator().manual_seed(10)
    ids = torch.tensor([0])
    with_ncc, without_ncc = TileLoss(LossConfig(lambda_ncc=1.0)), TileLoss(LossConfig(lambda_ncc=0.0))
    for noise in (0.0, 1e-5, 1e-2):
        base = 0.45 + noise * torch.randn(16, 16, 3, generator=gen)
        grads = []
        for loss_fn in (with_ncc, without_ncc):
            render = base.clone().requires_grad_(True)
            loss_fn(render, gt, ids)[0].backward()
            grads.append(render.grad)
        assert torch.isfinite(grads[0]).all()
        torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=1e-9)
        # L1 alone gives 1 / (3 * 256) per pixel; D-SSIM adds a few times that on noise.
        assert float(grads[0].abs().max()) < 0.05


def test_textured_ground_truth_with_flat_render_has_bounded_gradients():
    _, gt = random_images(16, 16, seed=11)
    render = torch.full((16, 16, 3), 0.5, requires_grad=True)
    loss, _ = TileLoss(LossConfig(lambda_ncc=1.0))(render, gt, torch.tensor([0]))
    loss.backward()
    assert torch.isfinite(render.grad).all()
    assert float(render.grad.abs().max()) < 1.0


def test_nan_in_unsampled_tiles_and_masked_pixels_never_leaks():
    height, width = 40, 40  # 3 x 3 tiles
    render, gt = random_images(height, width, seed=12)
    ids = torch.tensor([0, 4, 8])
    mask = torch.ones(height, width)
    mask[2:5, 3:9] = 0
    clean_loss, clean_errors = TileLoss()(render, gt, ids, mask)

    dirty = render.clone()
    sampled = torch.zeros(9, dtype=torch.bool)
    sampled[ids] = True
    pixel_tile = (torch.arange(height)[:, None] // 16) * 3 + torch.arange(width)[None, :] // 16
    unsampled_pixels = ~sampled[pixel_tile]
    dirty[unsampled_pixels] = float("nan")
    dirty[mask == 0] = float("nan")
    dirty_gt = gt.clone()
    dirty_gt[mask == 0] = float("inf")
    dirty.requires_grad_(True)
    loss, errors = TileLoss()(dirty, dirty_gt, ids, mask)
    loss.backward()
    assert loss.item() == pytest.approx(clean_loss.item(), rel=1e-6)
    torch.testing.assert_close(errors, clean_errors)
    assert torch.isfinite(dirty.grad).all()
    assert (dirty.grad[unsampled_pixels] == 0).all()
    assert (dirty.grad[mask == 0] == 0).all()
    assert (dirty.grad[~unsampled_pixels & (mask > 0)] != 0).any()


def test_config_rejects_patches_that_do_not_tile():
    with pytest.raises(TurboGSError, match="ncc_patch"):
        LossConfig(ncc_patch=6)
    with pytest.raises(TurboGSError, match="tile_size"):
        LossConfig(tile_size=12)
