"""Error-driven density control: the blame from the zero probe equals a brute-force sum
over pixels and Gaussians, changes no other gradient and never reads unsampled pixels;
growth, pruning, the budget and the optimizer state follow the rules, checked on states
built by hand."""

from __future__ import annotations

import math

import pytest
import torch
from density_helpers import MOMENTS, after_backward

from turbogs import kernels as ops
from turbogs.data.scene import Camera
from turbogs.density.base import DensityStep
from turbogs.density.error_driven import (
    ErrorDensityConfig,
    ErrorDrivenDensity,
    blame_term,
    decay_opacity,
    make_probe,
    pixel_error,
    tile_blame_term,
)
from turbogs.errors import InputError
from turbogs.gaussians import PARAM_NAMES, Gaussians, num_sh_bases
from turbogs.render import render
from turbogs.tiles import boxes_touch_tiles, sampled_pixels
from turbogs.turbo.losses import TileLoss

SIZE = 32  # 2 x 2 tiles
TILE_IDS = torch.tensor([0, 3])  # two diagonal tiles of four
TILE_MASK = torch.tensor([[True, False], [False, True]])


# --- a tiny real scene ---------------------------------------------------------------


def make_camera(width: int = SIZE, height: int = SIZE) -> Camera:
    K = torch.tensor([[36.0, 0.0, width / 2 + 0.3], [0.0, 34.0, height / 2 - 0.2], [0.0, 0.0, 1.0]])
    world_to_cam = torch.eye(4)
    world_to_cam[:3, 3] = torch.tensor([0.05, -0.03, 0.1])
    return Camera(name="cam", width=width, height=height, K=K, world_to_cam=world_to_cam)


def make_scene_gaussians(n: int = 10, seed: int = 0) -> Gaussians:
    """Overlapping Gaussians in front of the camera, several straddling tile borders."""
    g = torch.Generator().manual_seed(seed)
    params = {
        "means": torch.randn(n, 3, generator=g) * torch.tensor([0.5, 0.5, 0.3]) + torch.tensor([0.0, 0.0, 3.0]),
        "scales": torch.log(0.08 + 0.2 * torch.rand(n, 3, generator=g)),
        "quats": torch.randn(n, 4, generator=g),
        "opacities": torch.randn(n, generator=g),
        "sh0": torch.randn(n, 1, 3, generator=g) * 0.8,
        "shN": torch.randn(n, num_sh_bases(1) - 1, 3, generator=g) * 0.2,
    }
    return Gaussians(params, sh_degree=1, active_sh_degree=1)


def target_image(seed: int = 5) -> torch.Tensor:
    return torch.rand(SIZE, SIZE, 3, generator=torch.Generator().manual_seed(seed))


def brute_force_weights(gaussians: Gaussians, camera: Camera, pixels):
    """w_i(p) = alpha_i(p) T_i(p) for the listed (x, y) pixels, one pixel and one Gaussian
    at a time in depth order, with gsplat's rules. Returns {pixel: {gaussian: w}}."""
    with torch.no_grad():
        radii, means2d, depths, conics = ops.project(
            gaussians.means, gaussians.quats, gaussians.scales, camera.world_to_cam, camera.K,
            camera.width, camera.height, 0.01, 1e10, 0.3,
        )
        opacity = gaussians.opacities
    visible = (radii > 0).all(-1)
    order = [int(i) for i in torch.argsort(depths) if visible[i]]
    m, q, o = means2d.double().tolist(), conics.double().tolist(), opacity.double().tolist()
    weights = {}
    for x, y in pixels:
        px, py, T, w = x + 0.5, y + 0.5, 1.0, {}
        for i in order:
            dx, dy = m[i][0] - px, m[i][1] - py
            sigma = 0.5 * (q[i][0] * dx * dx + q[i][2] * dy * dy) + q[i][1] * dx * dy
            alpha = min(0.999, o[i] * math.exp(-sigma))
            if sigma < 0 or alpha < 1.0 / 255.0:
                continue
            if T * (1 - alpha) <= 1e-4:
                break
            w[i] = alpha * T
            T *= 1 - alpha
        weights[(x, y)] = w
    return weights


def render_with_blame(gaussians, camera, gt, error_map=None, probe_value=0.0, add_term=True):
    """One training-step forward and backward as the trainer does it; returns the probe."""
    probe = make_probe(len(gaussians))
    if probe_value:
        probe = torch.full_like(probe, probe_value).requires_grad_(True)
    out = render(gaussians, camera, tile_mask=TILE_MASK, extra_features=probe)
    loss, _ = TileLoss()(out.image, gt, TILE_IDS)
    if error_map is None:
        error_map = pixel_error(out.image, gt, TILE_MASK)
    if add_term:
        loss = loss + blame_term(out, error_map, TILE_MASK)
    loss.backward()
    return probe, out, loss


def param_grads(gaussians):
    grads = {name: gaussians.params[name].grad.clone() for name in PARAM_NAMES}
    for param in gaussians.params.values():
        param.grad = None
    return grads


# --- the blame -----------------------------------------------------------------------


def test_blame_equals_brute_force_sum_over_sampled_pixels():
    gaussians, camera, gt = make_scene_gaussians(), make_camera(), target_image()
    probe, out, _ = render_with_blame(gaussians, camera, gt)
    err = pixel_error(out.image, gt, TILE_MASK)

    inside = sampled_pixels(TILE_MASK, SIZE, SIZE)
    pixels = [(x, y) for y in range(SIZE) for x in range(SIZE) if inside[y, x]]
    assert len(pixels) == 2 * 16 * 16
    weights = brute_force_weights(gaussians, camera, pixels)
    expected_blame = torch.zeros(len(gaussians), dtype=torch.float64)
    expected_cover = torch.zeros(len(gaussians), dtype=torch.float64)
    for (x, y), w in weights.items():
        e = abs(out.image[y, x].detach().double() - gt[y, x].double()).mean()
        for i, wi in w.items():
            expected_blame[i] += wi * e
            expected_cover[i] += wi

    assert (expected_blame > 1e-3).sum() >= 6  # most Gaussians take part: the check has teeth
    torch.testing.assert_close(probe.grad[:, 0].double(), expected_blame, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(probe.grad[:, 1].double(), expected_cover, rtol=1e-4, atol=1e-5)
    # The value of the term (a zero probe composites to zero) adds nothing to the loss.
    assert float(blame_term(out, err, TILE_MASK).detach()) == 0.0


def test_blame_term_leaves_other_gradients_unchanged():
    gaussians, camera, gt = make_scene_gaussians(), make_camera(), target_image()
    probe, _, loss_with = render_with_blame(gaussians, camera, gt, add_term=True)
    with_term = param_grads(gaussians)
    _, _, loss_without = render_with_blame(gaussians, camera, gt, add_term=False)
    without_term = param_grads(gaussians)
    out = render(gaussians, camera, tile_mask=TILE_MASK)
    plain_loss, _ = TileLoss()(out.image, gt, TILE_IDS)
    plain_loss.backward()
    no_probe = param_grads(gaussians)

    assert probe.grad.abs().sum() > 0
    assert float(loss_with.detach()) == float(loss_without.detach()) == float(plain_loss.detach())
    for name in PARAM_NAMES:
        assert torch.equal(with_term[name], without_term[name]), name  # bit for bit
        torch.testing.assert_close(with_term[name], no_probe[name], rtol=1e-5, atol=1e-8)

    # The zero value is what makes this hold: a probe of ones would leak into the means.
    render_with_blame(gaussians, camera, gt, probe_value=1.0)
    leaky = param_grads(gaussians)
    assert not torch.allclose(leaky["means"], without_term["means"], rtol=1e-3, atol=1e-6)


def test_pixels_outside_sampled_tiles_never_contribute():
    gaussians, camera, gt = make_scene_gaussians(), make_camera(), target_image()
    inside = sampled_pixels(TILE_MASK, SIZE, SIZE)
    probe_clean, out, _ = render_with_blame(gaussians, camera, gt)
    clean = param_grads(gaussians)
    error = pixel_error(out.image, gt, TILE_MASK)

    # NaN in the error map outside the tiles: no effect on the blame or any gradient.
    poisoned_error = torch.where(inside, error, torch.tensor(float("nan")))
    probe, _, loss = render_with_blame(gaussians, camera, gt, error_map=poisoned_error)
    assert torch.isfinite(loss)
    assert torch.equal(probe.grad, probe_clean.grad)
    for name, grad in param_grads(gaussians).items():
        assert torch.equal(grad, clean[name]), name

    # NaN in the rendered extra channels outside the tiles (the GPU leaves them undefined).
    probe = make_probe(len(gaussians))
    out = render(gaussians, camera, tile_mask=TILE_MASK, extra_features=probe)
    out.extra = torch.where(inside[..., None], out.extra, torch.tensor(float("nan")))
    term = blame_term(out, poisoned_error, TILE_MASK)
    assert float(term.detach()) == 0.0
    term.backward()
    torch.testing.assert_close(probe.grad, probe_clean.grad)

    # pixel_error itself ignores undefined pixels of the render and of the ground truth.
    image = torch.where(inside[..., None], out.image.detach(), torch.tensor(float("nan")))
    assert torch.equal(pixel_error(image, gt, TILE_MASK), error)
    assert bool((error[~inside] == 0).all()) and bool((error[inside] > 0).any())


def test_the_blame_from_the_listed_tiles_equals_the_blame_over_the_image():
    """tile_blame_term reads only the sampled tiles' pixels and gives blame_term's value (0) and
    probe gradient, with a loss mask, partial tiles at the edges, and NaN outside the tiles."""
    gaussians, camera, gt = make_scene_gaussians(30, seed=2), make_camera(40, 36), torch.rand(36, 40, 3)
    tile_mask = torch.tensor([[True, False, True], [False, True, False], [False, False, True]])
    ids = torch.nonzero(tile_mask.reshape(-1)).squeeze(1)
    mask = (torch.rand(36, 40, generator=torch.Generator().manual_seed(5)) > 0.2).float()
    inside = sampled_pixels(tile_mask, 40, 36)
    grads = []
    for listed in (False, True):
        probe = make_probe(len(gaussians))
        out = render(gaussians, camera, tile_mask=tile_mask, extra_features=probe)
        out.extra = torch.where(inside[..., None], out.extra, torch.tensor(float("nan")))
        image = torch.where(inside[..., None], out.image, torch.tensor(float("nan")))
        if listed:
            term = tile_blame_term(out, image, gt, ids, mask)
        else:
            term = blame_term(out, pixel_error(image, gt, tile_mask, mask), tile_mask)
        assert float(term.detach()) == 0.0
        term.backward()
        grads.append(probe.grad.clone())
    assert bool((grads[0] != 0).any())
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)


def test_pixel_error_is_masked_mean_abs_difference():
    g = torch.Generator().manual_seed(3)
    image, gt, mask = torch.rand(20, 24, 3, generator=g), torch.rand(20, 24, 3, generator=g), torch.rand(20, 24, generator=g)
    tile_mask = torch.tensor([[False, True], [True, False]])  # the last row and column are partial
    err = pixel_error(image, gt, tile_mask, mask)
    for y in range(20):
        for x in range(24):
            expected = float(sum(abs(image[y, x, c] - gt[y, x, c]) for c in range(3)) / 3 * mask[y, x]) if (x >= 16) != (y >= 16) else 0.0
            assert abs(float(err[y, x]) - expected) < 1e-6


def test_boxes_touching_tiles_match_tile_intersection():
    """Reaching a tile = listed in some tile of the mask by the renderer's tile intersection."""
    g = torch.Generator().manual_seed(1)
    n, width, height = 60, 40, 30
    means2d = torch.rand(n, 2, generator=g) * torch.tensor([60.0, 50.0]) - 10.0
    radii = torch.randint(0, 12, (n, 2), generator=g).int()
    radii[radii.min(dim=-1).values == 0] = 0  # the projection culls on both axes
    depths = torch.rand(n, generator=g) + 1.0
    tile_mask = torch.tensor([[True, False, False], [False, False, True]])
    touching = boxes_touch_tiles(means2d, radii, tile_mask, width, height)
    _, flatten_ids = ops.intersect_tiles(means2d, radii, depths, 16, 3, 2, tile_mask)
    expected = torch.zeros(n, dtype=torch.bool)
    expected[flatten_ids.long()] = True
    assert torch.equal(touching, expected)
    assert 0 < int(touching.sum()) < int((radii > 0).all(-1).sum())  # the mask excludes some visible ones
    everything = boxes_touch_tiles(means2d, radii, None, width, height)
    assert int(everything.sum()) > int(touching.sum())


@pytest.mark.parametrize("seed", range(6))
def test_boxes_touching_tiles_match_a_loop_over_tiles(seed):
    """Random grids, masks and boxes (some off screen, some huge, wider than tall and the other
    way) against a loop over every tile of every box."""
    g = torch.Generator().manual_seed(seed)
    width, height = int(torch.randint(17, 120, (), generator=g)), int(torch.randint(17, 90, (), generator=g))
    tile_rows, tile_cols = (height + 15) // 16, (width + 15) // 16
    tile_mask = torch.rand(tile_rows, tile_cols, generator=g) < 0.3
    n = 80
    means2d = torch.rand(n, 2, generator=g) * torch.tensor([width * 1.6, height * 1.6]) - torch.tensor([width * 0.3, height * 0.3])
    radii = torch.randint(0, 40, (n, 2), generator=g).int()
    expected = torch.zeros(n, dtype=torch.bool)
    for i in range(n):
        if radii[i].min() <= 0:
            continue
        x, y = float(means2d[i, 0]) / 16, float(means2d[i, 1]) / 16
        rx, ry = float(radii[i, 0]) / 16, float(radii[i, 1]) / 16
        x0, x1 = max(math.floor(x - rx), 0), min(math.ceil(x + rx), tile_cols)
        y0, y1 = max(math.floor(y - ry), 0), min(math.ceil(y + ry), tile_rows)
        expected[i] = bool(tile_mask[y0:y1, x0:x1].any()) if x0 < x1 and y0 < y1 else False
    assert torch.equal(boxes_touch_tiles(means2d, radii, tile_mask, width, height), expected)
    assert 0 < int(expected.sum()) < n


def test_the_render_culls_what_reaches_no_rendered_tile():
    """With a tile mask the render reports as visible exactly the Gaussians the intersection
    lists, and the culled ones pass no gradient: density control counts the visible ones as
    exposed."""
    gaussians, camera = make_scene_gaussians(40, seed=3), make_camera()
    full = render(gaussians, camera)
    out = render(gaussians, camera, tile_mask=TILE_MASK)
    listed = torch.zeros(len(gaussians), dtype=torch.bool)
    rows, cols = TILE_MASK.shape
    radii_xy = torch.stack([full.radii, full.radii], -1).int()  # an upper bound of each axis's box
    _, ids = ops.intersect_tiles(full.means2d.detach(), radii_xy, full.depths.detach(), 16, cols, rows, TILE_MASK)
    listed[ids.long()] = True
    assert bool((out.visible <= full.visible).all()) and bool((out.visible <= listed).all())
    assert 0 < int(out.visible.sum()) < int(full.visible.sum())
    out.image.sum().backward()
    grads = gaussians.params["means"].grad.abs().sum(-1)
    assert float(grads[~out.visible].abs().sum()) == 0.0


# --- hand-made states -----------------------------------------------------------------


def make_gaussians(log_scales, opacities, seed=0):
    """Gaussians whose sh0[:, 0, 0] holds the row's id, so rows can be tracked."""
    n = len(log_scales)
    g = torch.Generator().manual_seed(seed)
    params = {
        "means": torch.randn(n, 3, generator=g),
        "scales": torch.tensor(log_scales, dtype=torch.float32)[:, None].repeat(1, 3),
        "quats": torch.randn(n, 4, generator=g),
        "opacities": torch.logit(torch.tensor(opacities, dtype=torch.float32)),
        "sh0": torch.randn(n, 1, 3, generator=g),
        "shN": torch.randn(n, 3, 3, generator=g),
    }
    params["sh0"][:, 0, 0] = torch.arange(n, dtype=torch.float32)
    return Gaussians(params, sh_degree=1)


def make_optimizers(gaussians):
    return {name: torch.optim.Adam([gaussians.params[name]], lr=0.0 if name == "sh0" else 0.01) for name in PARAM_NAMES}


def ids(gaussians):
    return gaussians.params["sh0"].detach()[:, 0, 0].round().long().tolist()


def hand_state(n, blame, weight=None, exposed=None, fade=None):
    return {
        "blame": torch.tensor(blame, dtype=torch.float32),
        "weight": torch.full((n,), 10.0) if weight is None else torch.tensor(weight, dtype=torch.float32),
        "exposed": torch.full((n,), 10.0) if exposed is None else torch.tensor(exposed, dtype=torch.float32),
        "fade": torch.zeros(n) if fade is None else torch.tensor(fade, dtype=torch.float32),
    }


SMALL, LARGE = math.log(0.005), math.log(0.3)  # vs percent_dense 0.01 x extent 1


def test_growth_where_blame_is_high_clones_small_and_splits_large():
    log_scales = [SMALL, SMALL, LARGE, LARGE, LARGE, SMALL, LARGE, SMALL]
    gaussians = make_gaussians(log_scales, [0.5] * 8)
    before = gaussians.raw()
    strategy = ErrorDrivenDensity(ErrorDensityConfig(grow_ratio=1.5, grow_fraction=1.0, max_gaussians=100,
                                                     opacity_decay=1.0))
    state = strategy.initial_state(8)
    state.update(hand_state(8, [0.01, 1.0, 0.01, 0.01, 2.0, 0.01, 0.02, 0.0]))
    stats = strategy.densify_and_prune(state, gaussians, make_optimizers(gaussians), 1.0, progress=0.9)

    assert (stats["n_cloned"], stats["n_split"], stats["n_pruned"]) == (1, 1, 0)
    assert ids(gaussians) == [0, 1, 2, 3, 5, 6, 7, 1, 4, 4]
    after = gaussians.raw()
    for name in PARAM_NAMES:  # the clone is an exact copy
        assert torch.equal(after[name][7], before[name][1]), name
    torch.testing.assert_close(after["scales"][8:], before["scales"][[4, 4]] - math.log(1.6))
    assert not torch.equal(after["means"][8], before["means"][4])
    assert all(float(v.abs().sum()) == 0 for v in state.values())  # the window restarted
    assert all(v.shape[0] == 10 for v in state.values())


def test_growth_takes_highest_blame_within_budget_and_fraction():
    gaussians = make_gaussians([SMALL, LARGE, SMALL, LARGE, SMALL, SMALL], [0.5] * 6)
    cfg = ErrorDensityConfig(grow_ratio=0.0, grow_fraction=1.0, max_gaussians=8, budget_start=6,
                             densify_from=0.0, budget_full_at=1.0)
    strategy = ErrorDrivenDensity(cfg)
    state = strategy.initial_state(6)
    state.update(hand_state(6, [0.3, 0.9, 0.1, 0.5, 0.7, 0.2]))
    assert strategy.budget_at(0.5) == 7
    strategy.densify_and_prune(state, gaussians, make_optimizers(gaussians), 1.0, progress=0.5)
    assert ids(gaussians) == [0, 2, 3, 4, 5, 1, 1]  # only the top score (a split) fits

    # The per-densification fraction limits growth even with room to spare.
    gaussians = make_gaussians([SMALL] * 10, [0.5] * 10)
    strategy = ErrorDrivenDensity(ErrorDensityConfig(grow_ratio=0.0, grow_fraction=0.2, max_gaussians=100))
    state = strategy.initial_state(10)
    # The score is blame per exposure: row 9 has the largest sum but was seen 4x as often.
    state.update(hand_state(10, [0.1 * i for i in range(10)], exposed=[10.0] * 9 + [40.0]))
    strategy.densify_and_prune(state, gaussians, make_optimizers(gaussians), 1.0, progress=0.9)
    assert ids(gaussians) == list(range(10)) + [7, 8]  # the top two; clones follow in row order


def test_growth_skips_what_the_loss_is_fading_out():
    """Rows 1 and 2 have the same high blame, but row 2's opacity gradient (summed over the
    window) says the loss is making it more transparent: a floater. Row 1 is cloned, row 2 not
    grown; rows 0 and 3-5 (low blame) neither. Without the fade, both would grow."""
    blame, fade = [0.1, 1.0, 1.0, 0.02, 0.02, 0.02], [0.0, -0.3, 0.2, 0.0, 0.0, 0.0]
    strategy = ErrorDrivenDensity(ErrorDensityConfig(grow_ratio=1.0, grow_fraction=1.0, max_gaussians=100,
                                                     opacity_decay=1.0))
    for fades, grown in ((fade, [1]), (None, [1, 2])):
        gaussians = make_gaussians([LARGE] + [SMALL] * 5, [0.5] * 6)
        state = strategy.initial_state(6)
        state.update(hand_state(6, blame, fade=fades))
        stats = strategy.densify_and_prune(state, gaussians, make_optimizers(gaussians), 1.0, progress=0.9)
        assert (stats["n_cloned"], stats["n_split"]) == (len(grown), 0)
        assert ids(gaussians) == list(range(6)) + grown


def test_the_fade_of_a_step_of_several_views_is_the_sum_of_each_views_opacity_gradient():
    """The opacity's .grad adds up over a step's views; observe gives each view its own part,
    so that the statistic is the same however the views are grouped into steps."""
    gaussians, camera = make_scene_gaussians(12, seed=4), make_camera()
    strategy = ErrorDrivenDensity(ErrorDensityConfig())
    state = strategy.initial_state(len(gaussians))
    per_view, observed = [], []
    for seed in (5, 6, 7):  # one step of three views, each loss divided by 3 as the trainer does
        before = torch.zeros(len(gaussians)) if gaussians.params["opacities"].grad is None \
            else gaussians.params["opacities"].grad.reshape(-1).clone()
        probe = make_probe(len(gaussians))
        out = render(gaussians, camera, tile_mask=TILE_MASK, extra_features=probe)
        gt = target_image(seed)
        loss, _ = TileLoss()(out.image, gt, TILE_IDS)
        ((loss + blame_term(out, pixel_error(out.image, gt, TILE_MASK), TILE_MASK)) / 3).backward()
        per_view.append(gaussians.params["opacities"].grad.reshape(-1) - before)
        observed.append(strategy.observe(state, DensityStep(1, 0.3, gaussians, {}, out, SIZE, SIZE, 1.0, probe,
                                                            grad_scale=3.0))["fade"])
    for mine, truth in zip(observed, per_view):
        torch.testing.assert_close(mine, truth * 3.0)
    assert all(float(view.abs().sum()) > 0 for view in per_view)


def test_pruning_by_opacity_size_and_hidden():
    log_scales = [SMALL, SMALL, math.log(1e-6), SMALL, SMALL, SMALL, LARGE]
    opacities = [0.5, 0.001, 0.5, 0.5, 0.5, 0.5, 0.5]
    gaussians = make_gaussians(log_scales, opacities)
    cfg = ErrorDensityConfig(hidden_weight=0.01, hidden_min_exposures=5, prune_min_scale=1e-4, max_gaussians=100)
    strategy = ErrorDrivenDensity(cfg)
    state = strategy.initial_state(7)
    #            normal  opacity  tiny   hidden  unseen  too-few  normal
    weight = [5.0, 5.0, 5.0, 0.05, 0.0, 0.0, 5.0]
    exposed = [10.0, 10.0, 10.0, 10.0, 0.0, 3.0, 10.0]
    state.update(hand_state(7, [0.0] * 7, weight, exposed))
    stats = strategy.densify_and_prune(state, gaussians, make_optimizers(gaussians), 1.0, progress=0.9)
    assert ids(gaussians) == [0, 4, 5, 6]
    assert (stats["n_pruned_opacity"], stats["n_pruned_tiny"], stats["n_pruned_hidden"], stats["n_pruned"]) == (1, 1, 1, 3)
    assert stats["n_cloned"] == stats["n_split"] == 0  # no blame, no growth


def test_hidden_pruning_waits_for_the_dense_phase():
    """Early on, a Gaussian behind others has little weight only because the ones in front have not
    faded yet: before hidden_from the hidden rule keeps it (opacity pruning does not wait)."""
    cfg = ErrorDensityConfig(hidden_weight=0.01, hidden_min_exposures=5, max_gaussians=100, hidden_from=0.2,
                             opacity_decay=1.0)
    pruned = {}
    for progress in (0.1, 0.2):
        gaussians = make_gaussians([SMALL] * 3, [0.5, 0.5, 0.001])
        strategy = ErrorDrivenDensity(cfg)
        state = strategy.initial_state(3)
        #                         normal hidden opacity
        state.update(hand_state(3, [0.0] * 3, [5.0, 0.05, 5.0], [10.0, 10.0, 10.0]))
        stats = strategy.densify_and_prune(state, gaussians, make_optimizers(gaussians), 1.0, progress=progress)
        pruned[progress] = (stats["n_pruned_hidden"], stats["n_pruned_opacity"], ids(gaussians))
    assert pruned[0.1] == (0, 1, [0, 1])
    assert pruned[0.2] == (1, 1, [0])


@pytest.mark.parametrize("split_into", [2, 3])
def test_budget_cap_holds_at_every_progress(split_into):
    cfg = ErrorDensityConfig(densify_from=0.1, budget_full_at=0.6, max_gaussians=60, grow_ratio=0.0,
                             grow_fraction=1.0, split_into=split_into, opacity_decay=1.0)
    strategy = ErrorDrivenDensity(cfg)
    n0 = 20
    gaussians = make_gaussians([SMALL, LARGE] * (n0 // 2), [0.5] * n0)
    optimizers = make_optimizers(gaussians)
    state = strategy.initial_state(n0)

    grid = [i / 100 for i in range(101)]
    budgets = [strategy.budget_at(p) for p in grid]
    assert budgets == sorted(budgets) and budgets[0] == budgets[10] == n0 and budgets[60] == budgets[-1] == 60
    assert budgets[35] == n0 + 20  # halfway up the ramp

    g = torch.Generator().manual_seed(0)
    for progress in grid:
        state["blame"] = torch.rand(len(gaussians), generator=g) + 0.1
        state["exposed"].fill_(10.0)
        state["weight"].fill_(10.0)
        strategy.densify_and_prune(state, gaussians, optimizers, 1.0, progress)
        assert len(gaussians) <= strategy.budget_at(progress), progress
    assert len(gaussians) >= 60 - (split_into - 1) + 1  # growth does fill the budget


def test_optimizer_state_consistent_after_densify():
    gaussians = make_gaussians([SMALL, LARGE, SMALL, LARGE, SMALL, SMALL], [0.5, 0.5, 0.001, 0.5, 0.5, 0.5])
    optimizers = make_optimizers(gaussians)
    g = torch.Generator().manual_seed(2)
    for _ in range(3):
        for param in gaussians.params.values():
            param.grad = torch.randn(param.shape, generator=g)
        for opt in optimizers.values():
            opt.step()
    before = {name: {m: optimizers[name].state[gaussians.params[name]][m].clone() for m in MOMENTS + ("step",)}
              for name in PARAM_NAMES}
    strategy = ErrorDrivenDensity(ErrorDensityConfig(grow_ratio=1.0, grow_fraction=1.0, max_gaussians=100))
    state = strategy.initial_state(6)
    state.update(hand_state(6, [0.0, 3.0, 0.0, 0.0, 3.0, 0.0]))
    strategy.densify_and_prune(state, gaussians, optimizers, 1.0, progress=0.9)

    # Row 2 pruned (opacity), row 4 cloned, row 1 split in two.
    assert ids(gaussians) == [0, 3, 4, 5, 4, 1, 1]
    kept = [0, 3, 4, 5]
    for name in PARAM_NAMES:
        param = gaussians.params[name]
        assert optimizers[name].param_groups[0]["params"] == [param]
        assert list(optimizers[name].state.keys()) == [param]
        state_now = optimizers[name].state[param]
        assert torch.equal(state_now["step"], before[name]["step"])
        for m in MOMENTS:
            assert state_now[m].shape == param.shape
            assert torch.equal(state_now[m][:4], before[name][m][kept]), (name, m)
            assert float(state_now[m][4:].abs().sum()) == 0.0, (name, m)
        assert param.grad is not None and param.grad.shape == param.shape
    for opt in optimizers.values():  # and the next step runs
        opt.step()


def test_after_backward_schedule_with_real_renders():
    """Three trainer steps with real renders: statistics accumulate every step, the
    densification fires only on schedule inside the window, Adam keeps stepping."""
    gaussians, camera, gt = make_scene_gaussians(12, seed=4), make_camera(), target_image()
    optimizers = make_optimizers(gaussians)
    cfg = ErrorDensityConfig(densify_every=2, densify_from=0.1, densify_until=0.8, grow_fraction=0.5,
                             max_gaussians=16, budget_full_at=0.5, hidden_min_exposures=1)
    strategy = ErrorDrivenDensity(cfg)
    state = strategy.initial_state(len(gaussians))
    history = []
    for step, progress in [(1, 0.2), (2, 0.3), (3, 0.4), (4, 0.9)]:
        probe = make_probe(len(gaussians)) if strategy.needs_blame(progress) else None
        out = render(gaussians, camera, tile_mask=TILE_MASK, extra_features=probe)
        loss, _ = TileLoss()(out.image, gt, TILE_IDS)
        if probe is not None:
            loss = loss + blame_term(out, pixel_error(out.image, gt, TILE_MASK), TILE_MASK)
        loss.backward()
        exposed_now = out.visible.float()
        before = {k: v.clone() for k, v in state.items()}
        stats = after_backward(strategy, state, step, gaussians, optimizers, out, SIZE, SIZE, 1.0,
                                        blame=None if probe is None else probe.grad, progress=progress)
        history.append(stats)
        if step in (1, 3):  # accumulated, not densified
            assert not stats["densified"]
            torch.testing.assert_close(state["blame"], before["blame"] + probe.grad[:, 0])
            torch.testing.assert_close(state["weight"], before["weight"] + probe.grad[:, 1])
            assert torch.equal(state["exposed"], before["exposed"] + exposed_now)
            torch.testing.assert_close(state["fade"], before["fade"] + gaussians.params["opacities"].grad.reshape(-1))
        for opt in optimizers.values():
            opt.step()
            opt.zero_grad(set_to_none=True)
        assert all(v.shape[0] == len(gaussians) for v in state.values())
        assert stats["n_gaussians"] == len(gaussians) <= stats["budget"]
    assert [s["densified"] for s in history] == [False, True, False, False]
    assert history[1]["n_cloned"] + history[1]["n_split"] > 0
    assert history[1]["n_gaussians"] > 12 - history[1]["n_pruned"]
    assert history[3]["n_gaussians"] == history[2]["n_gaussians"]  # past densify_until: nothing

    with pytest.raises(RuntimeError, match="blame"):
        after_backward(strategy, state, 5, gaussians, optimizers, out, SIZE, SIZE, 1.0, blame=None, progress=0.3)


def test_opacity_decay_scales_opacity_and_keeps_moments():
    gaussians = make_gaussians([SMALL] * 4, [0.2, 0.5, 0.9, 0.99])
    optimizers = make_optimizers(gaussians)
    gaussians.params["opacities"].grad = torch.ones(4)
    optimizers["opacities"].step()
    moments = optimizers["opacities"].state[gaussians.params["opacities"]]["exp_avg"].clone()
    before = gaussians.opacities.detach().clone()
    decay_opacity(gaussians, 0.9)
    torch.testing.assert_close(gaussians.opacities.detach(), before * 0.9)
    assert torch.equal(optimizers["opacities"].state[gaussians.params["opacities"]]["exp_avg"], moments)

    # Wired into densification: applied after growth, to every Gaussian.
    strategy = ErrorDrivenDensity(ErrorDensityConfig(opacity_decay=0.5, max_gaussians=100))
    state = strategy.initial_state(4)
    before = gaussians.opacities.detach().clone()
    strategy.densify_and_prune(state, gaussians, optimizers, 1.0, progress=0.5)
    torch.testing.assert_close(gaussians.opacities.detach(), before * 0.5)


def test_a_floater_the_loss_does_not_hold_is_pruned_within_a_short_runs_window():
    """The default decay's purpose: a Gaussian at the initial opacity (0.1) that no gradient keeps
    opaque (a point placed in empty space) fades to under a tenth of it by the end of a 1000-step
    run's window and below the pruning threshold in a 2000-step one, by the decay alone; none comes
    before the dense fifth of the run, which makes the surfaces opaque."""
    cfg = ErrorDensityConfig()
    strategy = ErrorDrivenDensity(cfg)
    for steps, limit in ((1000, 0.01), (2000, cfg.prune_opacity)):
        decays = [step for step in range(1, steps + 1) if strategy.should_densify(step, step / steps)
                  and step / steps >= cfg.opacity_decay_from]
        assert decays and decays[0] >= steps // 5
        gaussians = make_gaussians([SMALL], [0.1])
        for _ in decays:
            decay_opacity(gaussians, cfg.opacity_decay)
        assert float(gaussians.opacities[0]) < limit

    # wired in: no decay before opacity_decay_from, a decay after it
    strategy = ErrorDrivenDensity(ErrorDensityConfig(max_gaussians=100))
    for progress, factor in ((0.1, 1.0), (0.3, cfg.opacity_decay)):
        gaussians = make_gaussians([SMALL] * 2, [0.5, 0.9])
        optimizers = make_optimizers(gaussians)
        before = gaussians.opacities.detach().clone()
        strategy.densify_and_prune(strategy.initial_state(2), gaussians, optimizers, 1.0, progress=progress)
        torch.testing.assert_close(gaussians.opacities.detach(), before * factor)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"densify_from": 0.5, "densify_until": 0.4},
        {"densify_until": 1.5},
        {"budget_full_at": 0.01},
        {"densify_every": 0},
        {"max_gaussians": 0},
        {"grow_fraction": 0.0},
        {"opacity_decay": 1.5},
        {"opacity_decay_from": 1.5},
        {"hidden_weight": -1.0},
        {"hidden_from": 1.5},
    ],
)
def test_bad_config_raises_input_error(kwargs):
    with pytest.raises(InputError, match="error density setting"):
        ErrorDensityConfig(**kwargs)


def test_blame_term_rejects_render_without_probe():
    gaussians, camera = make_scene_gaussians(), make_camera()
    out = render(gaussians, camera, tile_mask=TILE_MASK)
    with pytest.raises(ValueError, match="make_probe"):
        blame_term(out, torch.zeros(SIZE, SIZE), TILE_MASK)
