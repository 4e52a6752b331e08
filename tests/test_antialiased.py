"""--antialiased: Mip-Splatting's 2D filter with opacity compensation, in the torch twin and
through the whole model life (train -> cfg_args/results.json -> eval, render, export).

The oracle: the screen covariance from the explicit pinhole Jacobian (as in test_render's
projection test), the compensation sqrt(det(cov) / det(cov + eps2d I)) from torch.linalg.det,
and test_render's per-pixel brute-force compositor with the compensated opacities.
"""

from __future__ import annotations

import gzip
import json
import math

import pytest
import torch
from test_render import brute_force_composite, make_camera, make_gaussians, world_covariance
from test_cli import small_demo

from turbogs.cli import main
from turbogs.formats.model_folder import load_gaussians, read_cfg_args
from turbogs.kernels import raster_torch
from turbogs.render import render

EPS2D = 0.3


def independent_compensation(gaussians, camera, eps2d=EPS2D):
    """[N] sqrt(det(J W S W^T J^T) / det(... + eps2d I)) for the Gaussians in front of the
    camera, from the written-out Jacobian (no field-of-view clamp: the test keeps them in view)."""
    R, t, K = camera.world_to_cam[:3, :3].double(), camera.world_to_cam[:3, 3].double(), camera.K.double()
    fx, fy = K[0, 0], K[1, 1]
    out = []
    for i in range(len(gaussians)):
        p = R @ gaussians.means[i].detach().double() + t
        cov = world_covariance(gaussians, i)
        J = torch.tensor([[fx / p[2], 0, -fx * p[0] / p[2] ** 2], [0, fy / p[2], -fy * p[1] / p[2] ** 2]],
                         dtype=torch.float64)
        cov2d = J @ R @ cov @ R.T @ J.T
        blurred = cov2d + eps2d * torch.eye(2, dtype=torch.float64)
        out.append(math.sqrt(float(torch.linalg.det(cov2d) / torch.linalg.det(blurred))))
    return torch.tensor(out, dtype=torch.float64)


def in_view_gaussians(n=12, seed=5, tiny=False):
    """Gaussians in front of the camera and on screen, some of them sub-pixel (where the
    compensation matters) when `tiny`."""
    gaussians = make_gaussians(n, seed=seed, spread=0.5)
    with torch.no_grad():
        gaussians.params["means"][:, 2] = 3.0 + torch.linspace(-0.5, 0.5, n)
        gaussians.params["means"][:, :2] = gaussians.params["means"][:, :2].clamp(-0.5, 0.5)
        if tiny:
            gaussians.params["scales"][: n // 2] = math.log(0.01)
    return gaussians


def test_twin_compensation_matches_the_independent_formula():
    gaussians = in_view_gaussians(tiny=True)
    camera = make_camera()
    radii, _, _, _, compensation = raster_torch.project(
        gaussians.means, gaussians.quats, gaussians.scales, camera.world_to_cam, camera.K,
        camera.width, camera.height, 0.01, 1e10, EPS2D, antialiased=True)
    assert bool((radii > 0).all())
    want = independent_compensation(gaussians, camera)
    torch.testing.assert_close(compensation.double(), want, atol=1e-5, rtol=1e-4)
    assert float(want.min()) < 0.5 and float(want.max()) > 0.9  # sub-pixel and large splats both checked


def test_antialiased_render_matches_brute_force_per_pixel():
    gaussians = in_view_gaussians(tiny=True)
    camera = make_camera(24, 20)
    background = torch.tensor([0.2, 0.3, 0.1])
    out = render(gaussians, camera, background=background, antialiased=True)
    radii, means2d, depths, conics = raster_torch.project(
        gaussians.means, gaussians.quats, gaussians.scales, camera.world_to_cam, camera.K,
        camera.width, camera.height, 0.01, 1e10, EPS2D)
    colors = torch.clamp_min(raster_torch.spherical_harmonics(1, gaussians.means - camera.center, gaussians.sh) + 0.5, 0)
    visible = (radii > 0).all(-1)
    opacities = gaussians.opacities.detach().double() * independent_compensation(gaussians, camera)
    want, want_alpha = brute_force_composite(means2d.detach().double(), conics.detach().double(),
                                             colors.detach().double(), opacities, depths.detach().double(), visible,
                                             camera.width, camera.height, background.double())
    torch.testing.assert_close(out.image.detach().double(), want, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.alpha.detach().double(), want_alpha, atol=1e-5, rtol=0)
    classic = render(gaussians, camera, background=background)  # the filter changes the image
    assert float((classic.alpha - out.alpha).detach().max()) > 1e-3


def test_compensation_is_one_when_the_filter_is_off():
    """No blur (eps2d = 0): the compensation is exactly the identity, and the antialiased
    render is the classic one; the classic mode never multiplies by anything."""
    gaussians = in_view_gaussians()
    camera = make_camera()
    args = (gaussians.means, gaussians.quats, gaussians.scales, camera.world_to_cam, camera.K,
            camera.width, camera.height, 0.01, 1e10)
    *_, compensation = raster_torch.project(*args, 0.0, antialiased=True)
    torch.testing.assert_close(compensation, torch.ones_like(compensation), atol=1e-6, rtol=0)
    assert len(raster_torch.project(*args, EPS2D)) == 4  # classic: no compensation returned
    gaussians.antialiased = False
    classic = render(gaussians, camera)
    gaussians.antialiased = True
    assert not torch.equal(render(gaussians, camera).image, classic.image)  # the model's own mode is used
    assert torch.equal(render(gaussians, camera, antialiased=False).image, classic.image)


def test_compensation_gradients_gradcheck():
    gaussians = in_view_gaussians(n=5, tiny=True)
    camera = make_camera()
    K, w2c = camera.K.double(), camera.world_to_cam.double()

    def compensation(means, quats, log_scales):
        return raster_torch.project(means, quats, torch.exp(log_scales), w2c, K, camera.width, camera.height,
                                    0.01, 1e10, EPS2D, antialiased=True)[4]

    inputs = tuple(gaussians.params[name].detach().double().requires_grad_() for name in ("means", "quats", "scales"))
    assert torch.autograd.gradcheck(compensation, inputs, eps=1e-6, atol=1e-5)


def test_antialiased_render_gradients_gradcheck():
    """Through the chain: the compensation times the opacity, into the hand-written compositor."""
    gaussians = in_view_gaussians(n=4, seed=7, tiny=True)
    camera = make_camera(16, 16)
    K, w2c = camera.K.double(), camera.world_to_cam.double()
    means, quats = gaussians.means.detach().double(), gaussians.quats.detach().double()
    colors = torch.rand(4, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def image(logit_opacities, log_scales):
        radii, means2d, depths, conics, compensation = raster_torch.project(
            means, quats, torch.exp(log_scales), w2c, K, 16, 16, 0.01, 1e10, EPS2D, antialiased=True)
        offsets, ids = raster_torch.intersect_tiles(means2d, radii, depths, 16, 1, 1)
        opacities = torch.sigmoid(logit_opacities) * compensation
        return raster_torch.rasterize(means2d, conics, colors, opacities, 16, 16, 16, offsets, ids)[0]

    inputs = (gaussians.params["opacities"].detach().double().requires_grad_(),
              gaussians.params["scales"].detach().double().requires_grad_())
    assert torch.autograd.gradcheck(image, inputs, eps=1e-6, atol=1e-5)


def test_the_model_records_it_and_every_command_uses_it(tmp_path, capsys):
    scene = small_demo(tmp_path, views=8)
    out = tmp_path / "model"
    assert main(["train", str(scene), "--out", str(out), "--steps", "30", "--eval", "--quiet", "--antialiased"]) == 0
    assert read_cfg_args(out / "cfg_args")["antialiased"] is True
    assert json.loads((out / "results.json").read_text())["antialiased"] is True
    gaussians, _ = load_gaussians(out, "cpu")
    assert gaussians.antialiased  # eval and render read the model through this
    psnr = json.loads((out / "results.json").read_text())["psnr"]
    assert main(["eval", str(out), "--no-images"]) == 0
    after = json.loads((out / "results.json").read_text())
    assert after["antialiased"] is True and after["psnr"] == pytest.approx(psnr, abs=1e-4)  # rendered as trained
    assert main(["export", str(out), "-o", str(tmp_path / "m.spz")]) == 0
    assert gzip.decompress((tmp_path / "m.spz").read_bytes())[14] & 1  # .spz's antialiased flag
    capsys.readouterr()
    assert main(["export", str(out), "-o", str(tmp_path / "m.ply")]) == 0
    assert "--antialiased" in capsys.readouterr().out  # a format that cannot record it says so
    from viewer.model_files import load_model as viewer_load
    assert viewer_load(out).antialiased  # the viewer's server-side render gets it too
