"""The colours' curvature bound (turbogs/optim/curvature.py: colour_curvature_bound) against the
brute-force Jacobian of a real render in the DC coefficients: equal to J^T J 1, and a bound on
J^T J (the Gauss-Newton matrix minus its diagonal is negative semi-definite)."""

from __future__ import annotations

import pytest
import torch
from test_antialiased import in_view_gaussians
from test_render import make_camera

from turbogs.optim.curvature import colour_curvature_bound
from turbogs.optim.hybrid import HybridConfig
from turbogs.render import render

SIDE = 16


def rendered(gaussians):
    """The image's pixels [M, 3] and alpha [M, 1]."""
    out = render(gaussians, make_camera(SIDE, SIDE))
    return out.image.reshape(-1, 3), out.alpha.reshape(-1, 1)


@pytest.fixture
def scene():
    gaussians = in_view_gaussians(n=10, seed=3)
    with torch.no_grad():  # mid-range colours: none clamped at 0, where J 1 is SH_C0 x alpha exactly
        gaussians.params["sh0"].mul_(0.1)
        gaussians.params["shN"].zero_()
    return gaussians


def brute_force_jacobian(gaussians) -> torch.Tensor:
    """d pixels / d sh0, [M * 3, N * 3]: one backward pass per pixel value."""
    values = rendered(gaussians)[0].reshape(-1)
    rows = [torch.autograd.grad(value, gaussians.params["sh0"], retain_graph=True)[0].reshape(-1) for value in values]
    return torch.stack(rows)


def test_it_is_the_gauss_newton_row_sum(scene):
    jacobian = brute_force_jacobian(scene)
    assert (jacobian >= -1e-7).all()  # the premise: colours enter with non-negative weights
    pixels, alpha = rendered(scene)
    bound = colour_curvature_bound(pixels, alpha, scene.params["sh0"])
    expected = (jacobian.T @ jacobian @ torch.ones(jacobian.shape[1])).reshape(bound.shape)
    assert expected.abs().max() > 0  # the scene is on screen
    torch.testing.assert_close(bound, expected, rtol=1e-4, atol=1e-7)


def test_it_bounds_the_gauss_newton_matrix(scene):
    jacobian = brute_force_jacobian(scene).double()
    gauss_newton = jacobian.T @ jacobian
    pixels, alpha = rendered(scene)
    bound = colour_curvature_bound(pixels, alpha, scene.params["sh0"]).double().reshape(-1)
    gap = torch.linalg.eigvalsh(torch.diag(bound) - gauss_newton)
    assert gap.min() >= -1e-6 * gauss_newton.diagonal().max()
    # The diagonal of J^T J alone is no bound where Gaussians overlap: the reason for the row sums.
    assert torch.linalg.eigvalsh(torch.diag(gauss_newton.diagonal()) - gauss_newton).min() < 0


def test_the_hybrid_curves_the_colours_with_it_and_the_rest_by_sample(scene):
    pixels, alpha = rendered(scene)
    config = HybridConfig(curvature_on=("means", "sh0"), loss_hessian_scale=2.0)
    estimates = config.estimate_curvature(pixels, alpha, scene.params, torch.Generator().manual_seed(0))
    bound = colour_curvature_bound(pixels, alpha, scene.params["sh0"]) * (2.0 / pixels.numel())
    assert bound.abs().max() > 0
    torch.testing.assert_close(estimates["sh0"], bound)
    assert set(estimates) == {"means", "sh0"} and estimates["means"].shape == scene.params["means"].shape
    assert (estimates["means"] > 0).any()
