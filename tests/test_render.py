"""The CPU rasterization chain against independent computations.

The oracle for compositing is a per-pixel Python loop written from gsplat's rules (no
tiles, no blocks, no vectorization), run in float64 with autograd, so that both values
and gradients can be compared. Tile intersection is checked against gsplat's own
(slow, loop-based) torch reference.
"""

from __future__ import annotations

import math

import pytest
import torch
from gsplat.cuda._torch_impl import _isect_offset_encode, _isect_tiles

from turbogs import kernels as ops
from turbogs.data.scene import Camera
from turbogs.gaussians import SH_C0, Gaussians, num_sh_bases
from turbogs.kernels import raster_cpu
from turbogs.kernels import raster_torch as torch_backend
from turbogs.render import render
from turbogs.tiles import TILE_SIZE, tile_grid

WIDTH, HEIGHT = 40, 30  # 3 x 2 tiles, the last column and row partial
SH_C1 = 0.4886025119029199


def make_camera(width: int = WIDTH, height: int = HEIGHT) -> Camera:
    """A slightly rotated camera a little off the origin, principal point off-center."""
    K = torch.tensor([[36.0, 0.0, width / 2 + 0.3], [0.0, 34.0, height / 2 - 0.2], [0.0, 0.0, 1.0]])
    angle = 0.1
    world_to_cam = torch.eye(4)
    world_to_cam[:3, :3] = torch.tensor(
        [[math.cos(angle), 0.0, math.sin(angle)], [0.0, 1.0, 0.0], [-math.sin(angle), 0.0, math.cos(angle)]]
    )
    world_to_cam[:3, 3] = torch.tensor([0.1, -0.05, 0.2])
    return Camera(name="cam", width=width, height=height, K=K, world_to_cam=world_to_cam)


def make_gaussians(n: int, seed: int, sh_degree: int = 1, spread: float = 1.0) -> Gaussians:
    """Random Gaussians mostly in view; a tenth behind the camera, a tenth far off-screen,
    and a few near-opaque ones in the middle, where pixels saturate and stop early."""
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(n, 3, generator=g) * torch.tensor([0.9, 0.7, 0.8]) * spread + torch.tensor([0.0, 0.0, 3.0])
    means[: n // 10, 2] = -1.0
    means[n // 10 : n // 5, 0] += 40.0
    opacities = torch.randn(n, generator=g) * 1.5
    opaque = slice(n // 5, n // 5 + 4)
    means[opaque, :2] *= 0.1
    opacities[opaque] = 5.0
    params = {
        "means": means,
        "scales": torch.log(0.04 + 0.3 * torch.rand(n, 3, generator=g)),
        "quats": torch.randn(n, 4, generator=g),
        "opacities": opacities,
        "sh0": torch.randn(n, 1, 3, generator=g) * 0.8,
        "shN": torch.randn(n, num_sh_bases(sh_degree) - 1, 3, generator=g) * 0.2,
    }
    return Gaussians(params, sh_degree=sh_degree, active_sh_degree=sh_degree)


def project_scene(gaussians: Gaussians, camera: Camera, backend=ops):
    return backend.project(
        gaussians.means, gaussians.quats, gaussians.scales, camera.world_to_cam, camera.K,
        camera.width, camera.height, 0.01, 1e10, 0.3,
    )


def brute_force_composite(means2d, conics, colors, opacities, depths, visible, width, height, background):
    """gsplat's compositing rules, one pixel at a time, every visible Gaussian in depth order.
    Returns colors [H, W, C] and alphas [H, W, 1], differentiable by autograd."""
    order = [int(i) for i in torch.argsort(depths.detach()) if visible[i]]
    m, q, o = means2d.detach().tolist(), conics.detach().tolist(), opacities.detach().tolist()
    rows = []
    for y in range(height):
        row = []
        for x in range(width):
            px, py = x + 0.5, y + 0.5
            T = torch.ones((), dtype=colors.dtype)
            pixel = torch.zeros(colors.shape[1], dtype=colors.dtype)
            for i in order:
                # Decide with plain floats; build the autograd graph only for kept terms.
                dx, dy = m[i][0] - px, m[i][1] - py
                sigma = 0.5 * (q[i][0] * dx * dx + q[i][2] * dy * dy) + q[i][1] * dx * dy
                if sigma < 0 or min(0.999, o[i] * math.exp(-sigma)) < 1.0 / 255.0:
                    continue
                dx, dy = means2d[i, 0] - px, means2d[i, 1] - py
                a, b, c = conics[i]
                alpha = torch.clamp_max(opacities[i] * torch.exp(-(0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy)), 0.999)
                next_T = T * (1 - alpha)
                if next_T <= 1e-4:
                    break
                pixel = pixel + alpha * T * colors[i]
                T = next_T
            if background is not None:
                pixel = pixel + T * background
            row.append(torch.cat([pixel, 1 - T[None]]))
        rows.append(torch.stack(row))
    out = torch.stack(rows)
    return out[..., :-1], out[..., -1:]


def reference_render(params, camera: Camera, background):
    """The whole chain in float64 from pre-activation parameters: projection (gsplat's torch
    formulas, checked below against our own), SH degree 1 written out, brute-force compositing."""
    means = params["means"]
    radii, means2d, depths, conics = ops.project(
        means, torch.nn.functional.normalize(params["quats"], dim=-1), torch.exp(params["scales"]),
        camera.world_to_cam.double(), camera.K.double(), camera.width, camera.height, 0.01, 1e10, 0.3,
    )
    d = torch.nn.functional.normalize(means - camera.center.double(), dim=-1)
    x, y, z = d[:, :1], d[:, 1:2], d[:, 2:]
    sh0, sh1 = params["sh0"][:, 0], params["shN"]
    colors = SH_C0 * sh0 + SH_C1 * (-y * sh1[:, 0] + z * sh1[:, 1] - x * sh1[:, 2]) + 0.5
    colors = torch.clamp_min(colors, 0.0)
    visible = (radii > 0).all(-1)
    opacities = torch.sigmoid(params["opacities"])
    return brute_force_composite(means2d, conics, colors, opacities, depths, visible, camera.width, camera.height, background)


def rasterize_inputs(seed: int, n: int = 40, channels: int = 3):
    gaussians = make_gaussians(n, seed)
    camera = make_camera()
    with torch.no_grad():
        radii, means2d, depths, conics = project_scene(gaussians, camera)
    colors = torch.rand(n, channels, generator=torch.Generator().manual_seed(seed + 100))
    opacities = torch.sigmoid(gaussians.params["opacities"].detach())
    return radii, means2d, depths, conics, colors, opacities


def tile_runs(offsets, ids):
    """Each tile's list of Gaussian ids."""
    ends = offsets.flatten()[1:].tolist() + [ids.numel()]
    return [ids[s:e].tolist() for s, e in zip(offsets.flatten().tolist(), ends)]


# --- projection and SH ------------------------------------------------------------


@pytest.mark.parametrize("backend", ["twin", "native"])
def test_project_matches_independent_formula(backend):
    if backend == "native" and not raster_cpu.load():
        pytest.skip("TurboGS's CPU kernels are not built here (no C++ compiler)")
    gaussians = make_gaussians(30, seed=0)
    camera = make_camera()
    radii, means2d, depths, conics = project_scene(gaussians, camera, torch_backend if backend == "twin" else raster_cpu)
    R, t, K = camera.world_to_cam[:3, :3].double(), camera.world_to_cam[:3, 3].double(), camera.K.double()
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    # gsplat clamps x/z and y/z in the Jacobian to the field of view plus 30 %.
    lim_x = ((camera.width - cx) / fx + 0.15 * camera.width / fx, cx / fx + 0.15 * camera.width / fx)
    lim_y = ((camera.height - cy) / fy + 0.15 * camera.height / fy, cy / fy + 0.15 * camera.height / fy)
    for i in range(30):
        p = R @ gaussians.means[i].detach().double() + t
        cov = world_covariance(gaussians, i)
        tx = p[2] * torch.clamp(p[0] / p[2], -lim_x[1], lim_x[0])
        ty = p[2] * torch.clamp(p[1] / p[2], -lim_y[1], lim_y[0])
        J = torch.tensor([[fx / p[2], 0, -fx * tx / p[2] ** 2], [0, fy / p[2], -fy * ty / p[2] ** 2]], dtype=torch.float64)
        cov2d = J @ R @ cov @ R.T @ J.T + 0.3 * torch.eye(2, dtype=torch.float64)
        mean2d = torch.stack([fx * p[0] / p[2] + cx, fy * p[1] / p[2] + cy])
        radius = torch.ceil(3.33 * torch.sqrt(torch.diagonal(cov2d)))
        on_image = bool(
            (mean2d[0] + radius[0] > 0) and (mean2d[0] - radius[0] < camera.width)
            and (mean2d[1] + radius[1] > 0) and (mean2d[1] - radius[1] < camera.height)
        )
        if p[2] < 0.01 or not on_image:
            assert radii[i].tolist() == [0, 0]
            assert depths[i] == 0 and means2d[i].abs().sum() == 0  # culled: reported as zeros
            continue
        assert radii[i].tolist() == radius.int().tolist()
        torch.testing.assert_close(means2d[i].double(), mean2d, atol=1e-4, rtol=1e-5)
        torch.testing.assert_close(depths[i].double(), p[2], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(conics[i].double(), torch.linalg.inv(cov2d).flatten()[[0, 1, 3]], atol=1e-5, rtol=1e-4)
    visible = (radii > 0).all(-1)
    assert 0 < int(visible.sum()) < 30  # both culled and visible Gaussians were checked


def test_spherical_harmonics_known_values():
    dirs = torch.tensor([[0.0, 0.0, 2.0], [1.0, 0.0, 0.0]])  # need not be unit length
    coeffs = torch.zeros(2, 4, 3)
    coeffs[:, 0] = 1.0
    coeffs[:, 3] = 1.0  # the band-1 basis -C1 * x
    torch.testing.assert_close(ops.spherical_harmonics(0, dirs, coeffs), torch.full((2, 3), SH_C0))
    expected = torch.tensor([SH_C0, SH_C0 - SH_C1])[:, None].expand(2, 3)
    torch.testing.assert_close(ops.spherical_harmonics(1, dirs, coeffs), expected)


# --- tile intersection ------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_intersect_tiles_matches_gsplat_reference(seed):
    radii, means2d, depths, *_ = rasterize_inputs(seed, n=50)
    tile_height, tile_width = tile_grid(HEIGHT, WIDTH)
    offsets, flatten_ids = ops.intersect_tiles(means2d, radii, depths, TILE_SIZE, tile_width, tile_height)
    _, isect_ids, ref_ids = _isect_tiles(means2d[None], radii[None], depths[None], TILE_SIZE, tile_width, tile_height)
    ref_offsets = _isect_offset_encode(isect_ids, 1, tile_width, tile_height)[0]
    assert flatten_ids.dtype == torch.int32 and offsets.dtype == torch.int32
    assert offsets.shape == (tile_height, tile_width)
    assert flatten_ids.tolist() == ref_ids.tolist()
    assert offsets.tolist() == ref_offsets.tolist()
    assert flatten_ids.numel() > 50  # several tiles per Gaussian on average


def test_intersect_tiles_sorts_by_tile_then_depth_then_index():
    # Two Gaussians at equal depth and a nearer one, all inside tile (0, 0); the last
    # also reaches tile (0, 1).
    means2d = torch.tensor([[4.0, 4.0], [5.0, 5.0], [14.0, 6.0]])
    radii = torch.tensor([[3, 3], [3, 3], [3, 3]], dtype=torch.int32)
    depths = torch.tensor([2.0, 1.0, 2.0])
    offsets, flatten_ids = ops.intersect_tiles(means2d, radii, depths, 16, 2, 2)
    assert tile_runs(offsets, flatten_ids) == [[1, 0, 2], [2], [], []]
    # gsplat's CUDA sort reads the float bits as unsigned: positive depths come first in
    # numeric order, then negatives (possible with near_plane < 0) in reverse order.
    means2d = torch.tensor([[4.0, 4.0]] * 4)
    depths = torch.tensor([-1.0, 2.0, -3.0, 0.5])
    offsets, flatten_ids = ops.intersect_tiles(means2d, torch.full((4, 2), 2, dtype=torch.int32), depths, 16, 1, 1)
    assert flatten_ids.tolist() == [3, 1, 0, 2]


def test_intersect_tiles_mask_drops_exactly_unselected_pairs():
    radii, means2d, depths, *_ = rasterize_inputs(3, n=50)
    tile_height, tile_width = tile_grid(HEIGHT, WIDTH)
    full = tile_runs(*ops.intersect_tiles(means2d, radii, depths, TILE_SIZE, tile_width, tile_height))
    mask = torch.tensor([[True, False, True], [False, True, False]])
    masked = tile_runs(*ops.intersect_tiles(means2d, radii, depths, TILE_SIZE, tile_width, tile_height, mask))
    for selected, full_run, masked_run in zip(mask.flatten().tolist(), full, masked):
        assert masked_run == (full_run if selected else [])
    assert any(run for run, selected in zip(full, mask.flatten().tolist()) if not selected)


# --- compositing ------------------------------------------------------------------


def test_rasterize_matches_brute_force_values_and_gradients():
    radii, means2d, depths, conics, colors, opacities = rasterize_inputs(seed=0, n=30)
    visible = (radii > 0).all(-1)
    tile_height, tile_width = tile_grid(HEIGHT, WIDTH)
    offsets, flatten_ids = ops.intersect_tiles(means2d, radii, depths, TILE_SIZE, tile_width, tile_height)
    background = torch.tensor([0.2, 0.5, 0.9])
    g = torch.Generator().manual_seed(7)
    weights_rgb, weights_alpha = torch.randn(HEIGHT, WIDTH, 3, generator=g), torch.randn(HEIGHT, WIDTH, 1, generator=g)

    def run(fn, dtype):
        inputs = [t.detach().to(dtype).requires_grad_() for t in (means2d, conics, colors, opacities, background)]
        rgb, alpha = fn(*inputs)
        ((rgb * weights_rgb.to(dtype)).sum() + (alpha * weights_alpha.to(dtype)).sum()).backward()
        return rgb.detach(), alpha.detach(), [t.grad for t in inputs]

    rgb, alpha, got = run(
        lambda m, co, cl, op, bg: ops.rasterize(m, co, cl, op, WIDTH, HEIGHT, TILE_SIZE, offsets, flatten_ids, bg),
        torch.float32,
    )
    ref_rgb, ref_alpha, want = run(
        lambda m, co, cl, op, bg: brute_force_composite(m, co, cl, op, depths, visible, WIDTH, HEIGHT, bg),
        torch.float64,
    )
    assert rgb.shape == (HEIGHT, WIDTH, 3) and alpha.shape == (HEIGHT, WIDTH, 1)
    torch.testing.assert_close(rgb.double(), ref_rgb, atol=1e-5, rtol=0)
    torch.testing.assert_close(alpha.double(), ref_alpha, atol=1e-5, rtol=0)
    assert 0.05 < float(ref_alpha.mean()) < 0.99 and float(ref_alpha.max()) > 0.999  # some pixels stop early
    for name, a, b in zip(["means2d", "conics", "colors", "opacities", "background"], got, want):
        scale = float(b.abs().max())
        assert scale > 0, name
        torch.testing.assert_close(a.double(), b, atol=1e-4 * scale, rtol=1e-3, msg=name)


def test_rasterize_skips_negative_sigma_of_indefinite_conics():
    # Conics that are not positive definite: sigma < 0 on part of the tile, where gsplat
    # skips the Gaussian. One tile, every Gaussian listed in it.
    g = torch.Generator().manual_seed(3)
    n = 6
    means2d = torch.rand(n, 2, generator=g) * 16
    conics = torch.tensor([[0.3, 0.0, 0.2]]).repeat(n, 1) + 0.05 * torch.rand(n, 3, generator=g)
    conics[1] = torch.tensor([0.2, 0.4, 0.1])  # det < 0
    conics[4] = torch.tensor([-0.05, 0.0, 0.3])  # a < 0
    colors, opacities = torch.rand(n, 3, generator=g), torch.full((n,), 0.6)
    depths = torch.arange(n, dtype=torch.float32)
    offsets = torch.zeros(1, 1, dtype=torch.int32)
    rgb, alpha = ops.rasterize(means2d, conics, colors, opacities, 16, 16, 16, offsets, torch.arange(n, dtype=torch.int32))
    ref_rgb, ref_alpha = brute_force_composite(
        means2d.double(), conics.double(), colors.double(), opacities.double(), depths,
        torch.ones(n, dtype=torch.bool), 16, 16, None,
    )
    torch.testing.assert_close(rgb.double(), ref_rgb, atol=1e-5, rtol=0)
    torch.testing.assert_close(alpha.double(), ref_alpha, atol=1e-5, rtol=0)


def test_rasterize_stops_before_the_saturating_gaussian():
    # Four Gaussians of alpha 0.95 on one pixel: transmittance 0.05, 0.0025, 0.000125,
    # then 6.25e-6 <= 1e-4, so the pixel stops before the fourth, which gets no gradient.
    means2d = torch.tensor([[0.5, 0.5]] * 4)
    conics = torch.tensor([[1.0, 0.0, 1.0]] * 4)
    opacities = torch.full((4,), 0.95, requires_grad=True)
    colors = torch.cat([torch.eye(3), torch.ones(1, 3)]).requires_grad_()
    offsets = torch.zeros(1, 1, dtype=torch.int32)
    flatten_ids = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    background = torch.tensor([1.0, 1.0, 1.0], requires_grad=True)
    rgb, alpha = ops.rasterize(means2d, conics, colors, opacities, 1, 1, 16, offsets, flatten_ids, background)
    torch.testing.assert_close(rgb[0, 0], torch.tensor([0.95, 0.05 * 0.95, 0.0025 * 0.95]) + 0.000125)
    torch.testing.assert_close(alpha[0, 0], torch.tensor([1 - 0.000125]))
    rgb.sum().backward()
    assert colors.grad[3].abs().sum() == 0 and opacities.grad[3] == 0
    assert colors.grad[2].abs().sum() > 0 and opacities.grad[2] != 0
    torch.testing.assert_close(background.grad, torch.full((3,), 0.000125))


def test_rasterize_clamped_alpha_passes_no_gradient_to_shape_or_opacity():
    # Pixel (0, 0) sits on the center of Gaussian 0, whose alpha there clamps to 0.999;
    # pixel (1, 0) is farther out, unclamped. As in gsplat, only the unclamped pixel
    # passes gradient to the Gaussian's opacity and 2D mean.
    means2d = torch.tensor([[0.5, 0.5], [1.0, 0.5]], requires_grad=True)
    conics = torch.tensor([[0.5, 0.0, 0.5], [0.5, 0.0, 0.5]])
    opacities = torch.tensor([0.9999, 0.5], requires_grad=True)
    colors = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], requires_grad=True)
    offsets = torch.zeros(1, 1, dtype=torch.int32)
    flatten_ids = torch.tensor([0, 1], dtype=torch.int32)
    rgb, alpha = ops.rasterize(means2d, conics, colors, opacities, 2, 1, 16, offsets, flatten_ids)
    assert float(alpha[0, 0].detach()) == pytest.approx(0.999 + 0.001 * 0.5 * math.exp(-0.0625), abs=1e-6)
    grad_opacity, grad_means = torch.autograd.grad(rgb[0, 0, 0], [opacities, means2d], retain_graph=True)
    assert grad_opacity[0] == 0 and grad_means[0].abs().sum() == 0
    grad_opacity, grad_means = torch.autograd.grad(rgb[0, 1, 0], [opacities, means2d])
    assert grad_opacity[0] > 0 and grad_means[0, 0] != 0


def test_rasterize_with_nothing_to_draw_gives_background():
    offsets = torch.zeros(2, 3, dtype=torch.int32)
    empty = torch.zeros(0, dtype=torch.int32)
    rgb, alpha = ops.rasterize(
        torch.zeros(4, 2), torch.ones(4, 3), torch.rand(4, 3), torch.ones(4), WIDTH, HEIGHT, TILE_SIZE,
        offsets, empty, torch.tensor([0.1, 0.2, 0.3]),
    )
    torch.testing.assert_close(rgb, torch.tensor([0.1, 0.2, 0.3]).expand(HEIGHT, WIDTH, 3))
    assert alpha.abs().sum() == 0


# --- render() ---------------------------------------------------------------------


def test_render_matches_brute_force_chain_values_and_gradients():
    # The whole chain, gradients down to the pre-activation parameters; a smaller image
    # (2 x 2 tiles) keeps the float64 per-pixel reference quick.
    camera = make_camera(24, 20)
    gaussians = make_gaussians(30, seed=11, spread=0.6)
    background = torch.tensor([0.3, 0.1, 0.6])
    g = torch.Generator().manual_seed(12)
    weights = torch.randn(20, 24, 3, generator=g)

    out = render(gaussians, camera, background=background)
    (out.image * weights).sum().backward()
    params64 = {k: v.detach().double().requires_grad_() for k, v in gaussians.params.items()}
    ref_image, ref_alpha = reference_render(params64, camera, background.double())
    (ref_image * weights.double()).sum().backward()

    ref_image, ref_alpha = ref_image.detach(), ref_alpha.detach()
    torch.testing.assert_close(out.image.detach().double(), ref_image, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.alpha.detach().double(), ref_alpha, atol=1e-5, rtol=0)
    assert 0.1 < float(ref_alpha.mean()) < 0.99 and float(ref_alpha.max()) > 0.999
    for name, param in gaussians.params.items():
        want = params64[name].grad
        scale = float(want.abs().max())
        assert scale > 0, name
        torch.testing.assert_close(param.grad.double(), want, atol=2e-4 * scale, rtol=2e-3, msg=name)


def test_render_outputs_visibility_and_means2d_grad():
    gaussians = make_gaussians(40, seed=4)
    out = render(gaussians, make_camera())
    radii, _, depths, _ = project_scene(gaussians, make_camera())
    assert out.radii.tolist() == radii.max(dim=-1).values.tolist()
    assert out.visible.tolist() == (radii[:, 0] > 0).tolist()
    assert not out.visible[:4].any()  # behind the camera
    assert out.visible.any()
    torch.testing.assert_close(out.depths, depths)
    assert out.extra is None and out.tile_mask is None
    out.image.sum().backward()
    assert out.means2d.grad is not None and out.means2d.grad.shape == (40, 2)
    assert out.means2d.grad[out.visible].abs().sum() > 0
    assert out.means2d.grad[~out.visible].abs().sum() == 0
    with torch.no_grad():
        assert render(gaussians, make_camera()).image.grad_fn is None


def test_render_with_nothing_visible():
    camera = make_camera()
    camera.world_to_cam = torch.eye(4)
    gaussians = make_gaussians(10, seed=0)
    with torch.no_grad():
        gaussians.params["means"][:, 2] = -5.0  # behind the camera
        gaussians.params["means"][0] = torch.tensor([0.3, 0.1, 0.0])  # on the camera's plane
    out = render(gaussians, camera, background=torch.tensor([1.0, 0.5, 0.0]))
    assert not out.visible.any()
    torch.testing.assert_close(out.image, torch.tensor([1.0, 0.5, 0.0]).expand(HEIGHT, WIDTH, 3))
    out.image.sum().backward()
    assert torch.equal(gaussians.params["means"].grad, torch.zeros(10, 3))  # finite, and zero
    empty = Gaussians({k: v[:0].detach() for k, v in gaussians.params.items()}, sh_degree=1)
    assert render(empty, camera).image.abs().sum() == 0


def test_render_sh_degree_and_background():
    gaussians = make_gaussians(40, seed=8)
    camera = make_camera()
    # Degree 0 ignores the higher bands entirely.
    with torch.no_grad():
        low = render(gaussians, camera, sh_degree=0)
        gaussians.params["shN"].mul_(5.0)
        assert torch.equal(render(gaussians, camera, sh_degree=0).image, low.image)
        assert not torch.equal(render(gaussians, camera).image, low.image)
        # The background fills what the Gaussians leave: image + (1 - alpha) * bg.
        background = torch.tensor([0.7, 0.2, 0.4])
        black = render(gaussians, camera)
        lit = render(gaussians, camera, background=background)
        torch.testing.assert_close(lit.image, black.image + (1 - black.alpha) * background)
        assert float((1 - black.alpha).max()) > 0.5
    with pytest.raises(ValueError, match="sh_degree"):
        render(gaussians, camera, sh_degree=2)


def unused_sh_gradients_are_zero(device: str) -> None:
    """Below the stored degree, the higher bands' coefficients past the active degree get a
    gradient of exactly 0 (and the used ones do not): the data-parallel step sends only the
    used ones (Gaussians.gradient_columns), since zeros summed over the ranks are zeros."""
    camera = make_camera()
    for active in (0, 1, 2):
        gaussians = make_gaussians(60, seed=3 + active, sh_degree=3).to(device)
        gaussians.active_sh_degree = active
        weights = torch.randn(camera.height, camera.width, 3, generator=torch.Generator().manual_seed(active))
        (render(gaussians, camera).image * weights.to(device)).sum().backward()
        grad = gaussians.params["shN"].grad.cpu()
        used = num_sh_bases(active) - 1
        assert gaussians.gradient_columns()[list(gaussians.params).index("shN")] == used
        assert torch.count_nonzero(grad[:, used:]) == 0, active
        assert active == 0 or torch.count_nonzero(grad[:, :used]) > 0


def test_unused_sh_coefficients_get_exactly_zero_gradient():
    unused_sh_gradients_are_zero("cpu")


def test_render_extra_channels():
    gaussians = make_gaussians(40, seed=9)
    camera = make_camera()
    features = torch.rand(40, 2, generator=torch.Generator().manual_seed(1))
    extra = torch.cat([torch.ones(40, 1), features], dim=1)
    background = torch.tensor([0.5, 0.5, 0.5])
    plain = render(gaussians, camera, background=background)
    out = render(gaussians, camera, background=background, extra_features=extra)
    assert out.extra.shape == (HEIGHT, WIDTH, 3)
    torch.testing.assert_close(out.image, plain.image)  # extra channels change no color
    # A channel of ones composites to alpha (background 0 for extra channels).
    torch.testing.assert_close(out.extra[..., :1], out.alpha)
    # Each feature channel is what rasterizing that feature as a color gives.
    with torch.no_grad():
        radii, means2d, depths, conics = project_scene(gaussians, camera)
        offsets, ids = ops.intersect_tiles(means2d, radii, depths, TILE_SIZE, 3, 2)
        want, _ = ops.rasterize(means2d, conics, features, gaussians.opacities, WIDTH, HEIGHT, TILE_SIZE, offsets, ids)
    torch.testing.assert_close(out.extra[..., 1:], want)
    # The gradient on a feature is sum over pixels of w_i(p) * dL/dfeature(p) (the error
    # blame of DESIGN.md). Rasterizing one-hot features gives every w_i(p) at once.
    extra.requires_grad_()
    err = torch.rand(HEIGHT, WIDTH, generator=torch.Generator().manual_seed(2))
    out = render(gaussians, camera, background=background, extra_features=extra)
    (out.extra[..., 0] * err).sum().backward()
    with torch.no_grad():
        per_gaussian, _ = ops.rasterize(means2d, conics, torch.eye(40), gaussians.opacities, WIDTH, HEIGHT, TILE_SIZE, offsets, ids)
    blame = (per_gaussian * err[..., None]).sum(dim=(0, 1))
    assert blame.abs().sum() > 0
    torch.testing.assert_close(extra.grad[:, 0], blame, atol=1e-5, rtol=1e-4)
    assert extra.grad[:, 1:].abs().sum() == 0


def test_tile_mask_all_selected_equals_dense_render():
    gaussians = make_gaussians(40, seed=5)
    camera = make_camera()
    dense = render(gaussians, camera)
    every = render(gaussians, camera, tile_mask=torch.ones(2, 3, dtype=torch.bool))
    assert torch.equal(every.image, dense.image) and torch.equal(every.alpha, dense.alpha)
    with pytest.raises(ValueError, match="tile_mask"):
        render(gaussians, camera, tile_mask=torch.ones(3, 2, dtype=torch.bool))


def test_tile_mask_renders_selected_tiles_only_and_unselected_get_no_gradient():
    gaussians = make_gaussians(40, seed=5)
    camera = make_camera()
    dense = render(gaussians, camera)
    mask = torch.tensor([[True, False, False], [False, True, True]])
    sparse = render(gaussians, camera, tile_mask=mask)
    assert torch.equal(sparse.tile_mask, mask)
    pixel_mask = mask.repeat_interleave(16, 0).repeat_interleave(16, 1)[:HEIGHT, :WIDTH]
    torch.testing.assert_close(sparse.image[pixel_mask], dense.image[pixel_mask], atol=1e-6, rtol=0)
    assert sparse.image[~pixel_mask].abs().sum() == 0 and sparse.alpha[~pixel_mask].abs().sum() == 0
    assert dense.image[~pixel_mask].abs().sum() > 0

    # A loss over every pixel, undefined ones included: only selected tiles pass gradient.
    sparse.image.sum().backward()
    radii, means2d, depths, _ = project_scene(gaussians, camera)
    _, ids = ops.intersect_tiles(means2d, radii, depths, TILE_SIZE, 3, 2, mask)
    in_selected = torch.zeros(40, dtype=torch.bool)
    in_selected[ids.long()] = True
    assert torch.equal(sparse.visible, in_selected)  # culled: what reaches no selected tile is not visible
    assert (out_of_mask := dense.visible & ~in_selected).any()
    for name in ("means", "opacities", "sh0"):
        grad = gaussians.params[name].grad
        assert grad[out_of_mask].abs().sum() == 0, name
        assert grad[in_selected].abs().sum() > 0, name
    # The gradient equals that of the dense render restricted to the selected pixels.
    dense_grad = torch.autograd.grad((dense.image * pixel_mask[..., None]).sum(), gaussians.params["means"])[0]
    torch.testing.assert_close(gaussians.params["means"].grad, dense_grad, atol=1e-6, rtol=1e-4)


def test_unselected_tiles_are_not_composited(monkeypatch):
    seen = []
    original = torch_backend._composite_blocks

    def spy(blocks, *args, **kwargs):
        seen.append(blocks.numel())
        return original(blocks, *args, **kwargs)

    monkeypatch.setattr(torch_backend, "_composite_blocks", spy)
    monkeypatch.setattr(ops, "_twins", True)  # the twin's blocks (the native kernel: tests/test_raster_cpu.py)
    mask = torch.tensor([[False, True, False], [False, False, False]])
    render(make_gaussians(40, seed=6), make_camera(), tile_mask=mask)
    assert sum(seen) == (TILE_SIZE // torch_backend.BLOCK_SIZE) ** 2  # one tile's blocks


def test_block_lists_keep_every_gaussian_that_reaches_a_pixel():
    # The per-block lists are an optimization: a Gaussian left out of a block must have
    # alpha < 1/255 on all of its pixels. Checked against the dense per-pixel alphas.
    radii, means2d, depths, conics, colors, opacities = rasterize_inputs(seed=2, n=50)
    offsets, ids = ops.intersect_tiles(means2d, radii, depths, TILE_SIZE, 3, 2)
    tiles = torch.arange(6)
    starts, counts, gauss = torch_backend._block_lists(means2d, conics, opacities, TILE_SIZE, 8, 3, offsets, ids, tiles)
    assert counts.numel() == 6 * 4
    runs = tile_runs(offsets, ids)
    dropped = 0
    for number in range(24):
        tile, sub = divmod(number, 4)
        listed = gauss[starts[number] : starts[number] + counts[number]].tolist()
        tile_list = runs[tile]
        assert listed == [i for i in tile_list if i in listed]  # depth order kept
        x0 = tile % 3 * 16 + sub % 2 * 8
        y0 = tile // 3 * 16 + sub // 2 * 8
        px, py = torch.meshgrid(torch.arange(x0, x0 + 8) + 0.5, torch.arange(y0, y0 + 8) + 0.5, indexing="xy")
        for i in set(tile_list) - set(listed):
            dx, dy = means2d[i, 0] - px, means2d[i, 1] - py
            a, b, c = conics[i]
            alpha = opacities[i] * torch.exp(-(0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy))
            assert float(alpha.max()) < 1.0 / 255.0
            dropped += 1
    assert dropped > 0


# --- the CUDA wrappers' glue, with gsplat's kernels swapped for reference code --------


def test_gsplat_backend_glue_with_reference_kernels(monkeypatch):
    """gsplat_backend only adds/removes the camera dimension and drops unselected tiles'
    pairs; with gsplat's CUDA entry points replaced by gsplat's torch references (and our
    compositor), it must agree with the torch backend exactly."""
    import gsplat.cuda._torch_impl as reference
    import gsplat.cuda._wrapper as wrapper

    from turbogs.kernels import raster_gsplat as gsplat_backend

    def projection(means, covars, quats, scales, viewmats, Ks, width, height, eps2d, near_plane, far_plane,
                   calc_compensations=False):
        covars, _ = reference._quat_scale_to_covar_preci(quats, scales, compute_preci=False)
        return reference._fully_fused_projection(means, covars, viewmats, Ks, width, height, eps2d, near_plane, far_plane,
                                                 calc_compensations=calc_compensations)

    def rasterize_to_pixels(means2d, conics, colors, opacities, width, height, tile_size, offsets, flatten_ids,
                            backgrounds=None, masks=None):
        assert means2d.dim() == 3 and offsets.dim() == 3 and (masks is None or masks.dim() == 3)
        rgb, alpha = torch_backend.rasterize(
            means2d[0], conics[0], colors[0], opacities[0], width, height, tile_size, offsets[0], flatten_ids,
            None if backgrounds is None else backgrounds[0], None if masks is None else masks[0],
        )
        return rgb[None], alpha[None]

    monkeypatch.setattr(wrapper, "fully_fused_projection", projection)
    def spherical_harmonics(degree, dirs, coeffs, masks=None):  # gsplat's masked-out rows are 0
        values = reference._spherical_harmonics(degree, dirs, coeffs)
        return values if masks is None else torch.where(masks[:, None], values, 0.0)

    monkeypatch.setattr(wrapper, "spherical_harmonics", spherical_harmonics)
    monkeypatch.setattr(wrapper, "isect_tiles", lambda *args: reference._isect_tiles(*args))
    monkeypatch.setattr(wrapper, "isect_offset_encode", reference._isect_offset_encode)
    monkeypatch.setattr(wrapper, "rasterize_to_pixels", rasterize_to_pixels)

    gaussians = make_gaussians(40, seed=13)
    camera = make_camera()
    args = (gaussians.means, gaussians.quats, gaussians.scales, camera.world_to_cam, camera.K, WIDTH, HEIGHT, 0.01, 1e10, 0.3)
    projected = gsplat_backend.project(*args)
    for got, want in zip(projected, torch_backend.project(*args)):
        torch.testing.assert_close(got, want)
    # antialiased: the opacity compensations too (gsplat's reference computes its own)
    projected_aa = gsplat_backend.project(*args, antialiased=True)
    assert len(projected_aa) == 5
    for got, want in zip(projected_aa, torch_backend.project(*args, antialiased=True)):
        torch.testing.assert_close(got, want)
    mask = torch.tensor([[True, False, True], [False, True, True]])
    culled = gsplat_backend.project(*args, tile_mask=mask)  # the tile cull, as the twin does it
    for got, want in zip(culled, torch_backend.project(*args, tile_mask=mask)):
        torch.testing.assert_close(got, want)
    assert 0 < int((culled[0] > 0).all(-1).sum()) < int((projected[0] > 0).all(-1).sum())
    radii, means2d, depths, conics = (t.detach() for t in projected)
    for tile_mask in (None, mask):
        got = gsplat_backend.intersect_tiles(means2d, radii, depths, TILE_SIZE, 3, 2, tile_mask)
        want = torch_backend.intersect_tiles(means2d, radii, depths, TILE_SIZE, 3, 2, tile_mask)
        assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
        colors, background = torch.rand(40, 4), torch.rand(4)
        image = gsplat_backend.rasterize(
            means2d, conics, colors, gaussians.opacities, WIDTH, HEIGHT, TILE_SIZE, *got, background, tile_mask
        )
        assert image[0].shape == (HEIGHT, WIDTH, 4) and image[1].shape == (HEIGHT, WIDTH, 1)
    dirs, coeffs = torch.randn(5, 3), torch.randn(5, 4, 3)
    torch.testing.assert_close(gsplat_backend.spherical_harmonics(1, dirs, coeffs), torch_backend.spherical_harmonics(1, dirs, coeffs))
    keep = torch.tensor([True, False, True, True, False])
    torch.testing.assert_close(gsplat_backend.spherical_harmonics(1, dirs, coeffs, keep),
                               torch_backend.spherical_harmonics(1, dirs, coeffs, keep))


def world_covariance(gaussians, i):
    """Gaussian i's 3D covariance R S S R^T from its quaternion and scales, in float64 (written
    out here, not taken from the code under test)."""
    w, x, y, z = torch.nn.functional.normalize(gaussians.params["quats"][i].detach().double(), dim=0).tolist()
    rot = torch.tensor([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ], dtype=torch.float64)
    return rot @ torch.diag(gaussians.scales[i].detach().double() ** 2) @ rot.T
