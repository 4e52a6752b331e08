"""The native CPU projection (cuda/cpu/projection_cpu.cpp) against its twin, the oracle.

Random Gaussians built to hold every case the projection's rules have: behind the camera, on
the near plane, beyond the far plane; off the image (culled) and outside the 1.3x field of
view but reaching into the image (the Jacobian's clamp active); zero, tiny and huge
quaternions (F.normalize's floor); flat and needle-like scales; and an intrinsics matrix with
skew. In float32 as accurate as the twin against a float64 reference, in float64 within 1e-12 of
the twin, a float64 gradcheck, the same bits on 1 and 2 threads, and the dispatch.
tests/test_render.py checks both against an independent formula.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_raster_cpu import native  # noqa: F401  (skip without a compiler, fail on a broken build)

from turbogs import kernels
from turbogs.kernels import raster_cpu, raster_torch

WIDTH, HEIGHT = 120, 90
NEAR, FAR, EPS2D = 0.2, 30.0, 0.3


def make_camera(dtype=torch.float32):
    """viewmat [4, 4] (rotated about two axes, moved) and K [3, 3] with skew, off-center."""
    a, b = 0.3, -0.2
    rx = torch.tensor([[1, 0, 0], [0, math.cos(a), -math.sin(a)], [0, math.sin(a), math.cos(a)]])
    ry = torch.tensor([[math.cos(b), 0, math.sin(b)], [0, 1, 0], [-math.sin(b), 0, math.cos(b)]])
    viewmat = torch.eye(4)
    viewmat[:3, :3] = rx @ ry
    viewmat[:3, 3] = torch.tensor([0.2, -0.1, 0.4])
    K = torch.tensor([[110.0, 0.7, 63.0], [0.0, 104.0, 41.0], [0.0, 0.0, 1.0]])
    return viewmat.to(dtype), K.to(dtype)


def make_gaussians(n: int, seed: int, dtype=torch.float32):
    """(means, quats, scales) in world space; the special cases come first."""
    viewmat, _ = make_camera(torch.float64)
    g = torch.Generator().manual_seed(seed)
    means_c = torch.randn(n, 3, generator=g, dtype=torch.float64) * torch.tensor([1.2, 0.9, 1.5])
    means_c[:, 2] += 5.0
    quats = torch.randn(n, 4, generator=g, dtype=torch.float64)
    scales = torch.exp(torch.rand(n, 3, generator=g, dtype=torch.float64) * math.log(300.0)) * 0.002  # to 0.6
    means_c[0, 2] = -2.0  # behind the camera
    means_c[1] = torch.tensor([0.01, -0.01, NEAR + 1e-3])  # just inside the near plane
    means_c[2, 2] = FAR + 1.0  # beyond the far plane
    means_c[3, 2] = NEAR * 0.5  # in front of the camera, closer than the near plane
    means_c[4:14] = torch.tensor([0.0, 0.0, 5.0])
    means_c[4:8, 0] = 10.0  # at x/z = 2, past the 1.3x field of view (about 0.92)
    scales[4:6] = 2.0  # ... big enough to reach into the image: visible, clamped
    means_c[8:10, 0] = -7.5  # left, same
    scales[8] = 2.0
    means_c[10:12, 1] = 8.0  # below
    scales[10] = 2.5
    means_c[12:14, 0] = 15.0  # far off the image: culled
    quats[14] = 0.0  # no rotation at all (F.normalize leaves it zero)
    quats[15] *= 1e-14  # below F.normalize's floor
    quats[16] *= 1e6
    scales[17] = torch.tensor([3e-3, 0.3, 0.3])  # flat
    scales[18] = torch.tensor([0.5, 3e-3, 3e-3])  # a needle
    rotation, translation = viewmat[:3, :3], viewmat[:3, 3]
    means = (means_c - translation) @ rotation  # R^T (x_c - t)
    return [t.to(dtype) for t in (means, quats, scales)]


def project_with(backend, gaussians, dtype, antialiased, seed=5):
    """Outputs and the gradients (means, quats, scales) of a random linear function of them."""
    viewmat, K = make_camera(dtype)
    leaves = [t.detach().clone().requires_grad_() for t in gaussians]
    outputs = backend.project(*leaves, viewmat, K, WIDTH, HEIGHT, NEAR, FAR, EPS2D, antialiased)
    g = torch.Generator().manual_seed(seed)
    loss = sum((out * torch.randn(out.shape, generator=g, dtype=torch.float64).to(dtype)).sum() for out in outputs[1:])
    loss.backward()
    return [out.detach() for out in outputs], [leaf.grad for leaf in leaves]


FLOAT32_EPS = torch.finfo(torch.float32).eps


def relative_error(got, want, rows):
    """The largest error over `rows`, relative to the largest value there."""
    return float((got[rows] - want[rows]).abs().max() / want[rows].abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("antialiased", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_native_projection_in_float32_is_as_accurate_as_the_twin(antialiased, seed):
    """Both float32 projections against the twin in float64 on the same inputs: the native one's
    error, relative to the largest value of each output and gradient, is within 8x the twin's own
    (what float32 rounding does to this arithmetic on this CPU: the conic's inverse of a needle's
    covariance loses digits to cancellation in both) plus 64 float32 epsilons. A figure fixed on one
    CPU would not hold on another, which rounds and fuses differently."""
    gaussians = make_gaussians(3000, seed, torch.float32)
    (radii, *floats), grads = project_with(raster_cpu, gaussians, torch.float32, antialiased)
    (radii_t, *floats_t), grads_t = project_with(raster_torch, gaussians, torch.float32, antialiased)
    (radii_r, *floats_r), grads_r = project_with(raster_torch, [t.double() for t in gaussians], torch.float64,
                                                 antialiased)

    # A radius is a ceil: another rounding may move one across an integer, nothing more.
    assert int((radii != radii_t).any(-1).sum()) <= 2
    assert int((radii - radii_t).abs().max()) <= 1
    visible, visible_t = (radii > 0).any(-1), (radii_t > 0).any(-1)
    assert torch.equal(visible, visible_t)
    assert bool(visible[[1, 4, 5, 8, 10, 14, 15, 16, 17, 18]].all()), "the special cases meant to be seen"
    assert not bool(visible[[0, 2, 3, 12, 13]].any()), "the special cases meant to be culled"
    everywhere = torch.ones_like(visible)
    compared = visible & (radii_r > 0).any(-1)
    for name, got, twin, reference, rows in [*[(f"output {i}", a, b, c, compared) for i, (a, b, c) in
                                               enumerate(zip(floats, floats_t, floats_r))],
                                             *[(f"{n} gradient", a, b, c.float(), everywhere) for n, a, b, c in
                                               zip(["means", "quats", "scales"], grads, grads_t, grads_r)]]:
        error, twin_error = relative_error(got, reference.float(), rows), relative_error(twin, reference.float(), rows)
        assert error <= 8 * twin_error + 64 * FLOAT32_EPS, f"{name}: {error:.2e}, the twin {twin_error:.2e}"
    for got in floats + grads:
        assert bool((got[~visible] == 0).all()), "culled: zeros, and no gradient"


@pytest.mark.parametrize("antialiased", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_native_projection_in_float64_matches_the_twin(antialiased, seed):
    """In float64 the two agree to within 1e-12 of the largest value (forward) and 1e-11
    (gradients): a million times float64's epsilon, and a million times closer than float32's."""
    gaussians = make_gaussians(3000, seed, torch.float64)
    (radii, *floats), grads = project_with(raster_cpu, gaussians, torch.float64, antialiased)
    (radii_t, *floats_t), grads_t = project_with(raster_torch, gaussians, torch.float64, antialiased)
    assert torch.equal(radii, radii_t)
    visible = (radii > 0).any(-1)
    for got, want in zip(floats, floats_t):
        assert relative_error(got, want, visible) <= 1e-12
    for name, got, want in zip(["means", "quats", "scales"], grads, grads_t):
        assert relative_error(got, want, torch.ones_like(visible)) <= 1e-11, name


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_native_tile_cull_matches_the_twin_and_a_loop_over_tiles(seed):
    """With a tile mask, both cull exactly the Gaussians whose tile box (the intersection's
    float32 rule) reaches no selected tile, against a loop over each box's tiles; the culled
    report zeros and get no gradient, and the rest are what the projection without a mask
    gives them."""
    gaussians = make_gaussians(3000, seed, torch.float64)
    g = torch.Generator().manual_seed(seed)
    tile_rows, tile_cols = (HEIGHT + 15) // 16, (WIDTH + 15) // 16
    tile_mask = torch.rand(tile_rows, tile_cols, generator=g) < 0.25
    viewmat, K = make_camera(torch.float64)
    plain = raster_torch.project(*gaussians, viewmat, K, WIDTH, HEIGHT, NEAR, FAR, EPS2D)
    expected = torch.zeros(3000, dtype=torch.bool)
    for i in torch.nonzero((plain[0] > 0).all(-1)).squeeze(1).tolist():
        x, y = (float(v) / 16 for v in plain[1][i].float())
        rx, ry = (float(v) / 16 for v in plain[0][i])
        x0, x1 = max(math.floor(x - rx), 0), min(math.ceil(x + rx), tile_cols)
        y0, y1 = max(math.floor(y - ry), 0), min(math.ceil(y + ry), tile_rows)
        expected[i] = x0 < x1 and y0 < y1 and bool(tile_mask[y0:y1, x0:x1].any())
    assert 0 < int(expected.sum()) < int((plain[0] > 0).all(-1).sum())
    for backend in (raster_cpu, raster_torch):
        leaves = [t.clone().requires_grad_() for t in gaussians]
        radii, means2d, depths, conics = backend.project(*leaves, viewmat, K, WIDTH, HEIGHT, NEAR, FAR, EPS2D,
                                                         tile_mask=tile_mask)
        assert torch.equal((radii > 0).all(-1), expected), backend.__name__
        assert torch.equal(radii[expected], plain[0][expected]) and not radii[~expected].any()
        for got, want in zip((means2d.detach(), depths.detach(), conics.detach()), plain[1:]):
            assert float((got[expected] - want[expected]).abs().max()) <= 1e-12 * float(want.abs().max())
            assert not got[~expected].any()
        (means2d.sum() + depths.sum() + conics.sum()).backward()
        for leaf in leaves:
            assert not leaf.grad[~expected].any() and leaf.grad[expected].any()


@pytest.mark.parametrize("seed", [0, 1])
def test_gaussians_just_off_the_image_are_culled_exactly_as_the_twin_culls_them(seed):
    """Needles and discs of every orientation just outside each edge (some reaching in, some
    not), with and without a tile mask: the native projection culls exactly the Gaussians the
    twin culls (the image's edges and the tile boxes decided in one float rule)."""
    viewmat, K = make_camera(torch.float64)
    g = torch.Generator().manual_seed(seed)
    n = 4000
    depth = 1.0 + 6.0 * torch.rand(n, generator=g, dtype=torch.float64)
    edge = torch.randint(4, (n,), generator=g)
    # screen positions within 40 px of an edge, on either side of it
    along = torch.rand(n, generator=g, dtype=torch.float64)
    off = (torch.rand(n, generator=g, dtype=torch.float64) - 0.3) * 40
    px = torch.where(edge == 0, -off, torch.where(edge == 1, WIDTH + off, along * WIDTH))
    py = torch.where(edge == 2, -off, torch.where(edge == 3, HEIGHT + off, along * HEIGHT))
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    y_c = (py - cy) / fy * depth
    x_c = (px - cx - K[0, 1] * y_c / depth) / fx * depth
    means_c = torch.stack([x_c, y_c, depth], dim=-1)
    means = (means_c - viewmat[:3, 3]) @ viewmat[:3, :3]
    quats = torch.randn(n, 4, generator=g, dtype=torch.float64)
    scales = torch.exp(torch.rand(n, 3, generator=g, dtype=torch.float64) * math.log(1000.0)) * 2e-4
    scales[: n // 2, 1:] = 1e-3  # needles
    tile_mask = torch.rand((HEIGHT + 15) // 16, (WIDTH + 15) // 16, generator=g) < 0.3
    for mask in (None, tile_mask):
        native = raster_cpu.project(means, quats, scales, viewmat, K, WIDTH, HEIGHT, NEAR, FAR, EPS2D, tile_mask=mask)
        twin = raster_torch.project(means, quats, scales, viewmat, K, WIDTH, HEIGHT, NEAR, FAR, EPS2D, tile_mask=mask)
        assert torch.equal(native[0], twin[0])
        visible = (twin[0] > 0).all(-1)
        assert 0.1 * n < int(visible.sum()) < 0.9 * n


def test_the_clamped_jacobian_and_the_normalize_floor_are_exercised():
    """The cases above are what they claim: some visible Gaussians have x/z or y/z past the
    widened field of view, and the quaternions span F.normalize's floor."""
    means, quats, _ = make_gaussians(3000, 0, torch.float64)
    viewmat, K = make_camera(torch.float64)
    means_c = means @ viewmat[:3, :3].T + viewmat[:3, 3]
    u = means_c[:, 0] / means_c[:, 2]
    limit = (WIDTH - K[0, 2]) / K[0, 0] + 0.15 * WIDTH / K[0, 0]
    assert bool((u[4:6] > limit).all())
    assert float(quats[15].norm()) < 1e-12 < float(quats[16].norm())


def test_native_projection_gradients_against_finite_differences():
    means, quats, scales = make_gaussians(40, 2, torch.float64)
    viewmat, K = make_camera(torch.float64)
    # Visible, and not the quaternion below the floor (a finite difference step would lift it above).
    keep = [1, 4, 5, 8, 10, 14, 16, 17, 18] + list(range(20, 40))
    inputs = [t[keep].clone().requires_grad_() for t in (means, quats, scales)]

    def projected(means, quats, scales):
        return raster_cpu.project(means, quats, scales, viewmat, K, WIDTH, HEIGHT, NEAR, FAR, EPS2D, True)[1:]

    assert bool((raster_cpu.project(*inputs, viewmat, K, WIDTH, HEIGHT, NEAR, FAR, EPS2D)[0] > 0).all())
    assert torch.autograd.gradcheck(projected, inputs, eps=1e-7, atol=1e-6, rtol=1e-5)


def test_native_projection_does_not_depend_on_the_thread_count():
    gaussians = make_gaussians(5000, 3)
    before = torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            runs.append(project_with(raster_cpu, gaussians, torch.float32, True))
    finally:
        torch.set_num_threads(before)
    for got, want in zip(runs[0][0] + runs[0][1], runs[1][0] + runs[1][1]):
        assert torch.equal(got, want)


def test_the_dispatch_projects_natively_and_leaves_camera_gradients_to_the_twin(monkeypatch):
    calls = []
    native_forward = raster_cpu._Project.forward

    def counting(*args):
        calls.append(1)
        return native_forward(*args)

    monkeypatch.setattr(raster_cpu._Project, "forward", staticmethod(counting))
    means, quats, scales = make_gaussians(200, 4)
    viewmat, K = make_camera()
    kernels.use_torch_twins(False)
    kernels.project(means, quats, scales, viewmat, K, WIDTH, HEIGHT, NEAR, FAR, EPS2D)
    assert len(calls) == 1
    # A camera being optimized: its gradient comes from the twin, and agrees with autograd's.
    viewmat = viewmat.clone().requires_grad_()
    _, means2d, _, conics = kernels.project(means, quats, scales, viewmat, K, WIDTH, HEIGHT, NEAR, FAR, EPS2D)
    (means2d.sum() + conics.sum()).backward()
    assert len(calls) == 1 and viewmat.grad is not None and float(viewmat.grad.abs().sum()) > 0
    kernels.use_torch_twins(True)
    try:
        kernels.project(means, quats, scales, viewmat.detach(), K, WIDTH, HEIGHT, NEAR, FAR, EPS2D)
    finally:
        kernels.use_torch_twins(False)
    assert len(calls) == 1
