"""gsplat's CUDA chain against the torch twin: same scene, same outputs and gradients.

Runs only where CUDA is available; the CPU path is itself checked against brute force in
test_render.py, so agreeing with it here checks the CUDA wrappers.
"""

from __future__ import annotations

import pytest
import torch
from test_render import HEIGHT, WIDTH, make_camera, make_gaussians

from turbogs import kernels as ops
from turbogs.render import render
from turbogs.tiles import TILE_SIZE, tile_grid

pytestmark = pytest.mark.cuda  # tests/conftest.py skips these where torch sees no GPU


def render_with_grads(gaussians, camera, device, **kwargs):
    gaussians = gaussians.to(device)
    gaussians.zero_grad(set_to_none=True)
    weights = torch.randn(camera.height, camera.width, 3, generator=torch.Generator().manual_seed(5)).to(device)
    out = render(gaussians, camera, **kwargs)
    mask = kwargs.get("tile_mask")
    if mask is not None:  # unselected pixels are undefined: keep them out of the loss
        pixel_mask = mask.repeat_interleave(TILE_SIZE, 0).repeat_interleave(TILE_SIZE, 1)[: camera.height, : camera.width]
        weights = weights * pixel_mask[..., None].to(device)
    ((out.image * weights).sum() + out.alpha.sum()).backward()
    grads = {name: p.grad.detach().cpu() for name, p in gaussians.params.items()}
    return out, grads


def assert_grads_close(cpu_grads, cuda_grads):
    for name, want in cpu_grads.items():
        scale = float(want.abs().max())
        assert scale > 0, name
        torch.testing.assert_close(cuda_grads[name], want, atol=1e-3 * scale, rtol=1e-2, msg=name)


@pytest.mark.parametrize("seed, antialiased", [(0, False), (1, False), (2, True)])
def test_cuda_render_matches_cpu(seed, antialiased):
    """Classic, and --antialiased (gsplat's compensations against the twin's, values and gradients)."""
    camera = make_camera()
    background = torch.tensor([0.2, 0.4, 0.6])
    cpu_out, cpu_grads = render_with_grads(make_gaussians(60, seed), camera, "cpu", background=background,
                                           antialiased=antialiased)
    cuda_out, cuda_grads = render_with_grads(make_gaussians(60, seed), camera, "cuda", background=background,
                                             antialiased=antialiased)
    torch.testing.assert_close(cuda_out.image.cpu(), cpu_out.image.detach(), atol=1e-4, rtol=0)
    torch.testing.assert_close(cuda_out.alpha.cpu(), cpu_out.alpha.detach(), atol=1e-4, rtol=0)
    assert torch.equal(cuda_out.radii.cpu(), cpu_out.radii)
    visible = cpu_out.visible
    torch.testing.assert_close(cuda_out.depths.cpu()[visible], cpu_out.depths.detach()[visible], atol=1e-5, rtol=1e-5)
    assert torch.equal(cuda_out.depths.cpu()[~visible], torch.zeros(int((~visible).sum())))
    torch.testing.assert_close(cuda_out.means2d.grad.cpu(), cpu_out.means2d.grad, atol=1e-4, rtol=1e-2)
    assert_grads_close(cpu_grads, cuda_grads)


def test_cuda_unused_sh_coefficients_get_exactly_zero_gradient():
    from test_render import unused_sh_gradients_are_zero

    unused_sh_gradients_are_zero("cuda")


def test_cuda_tile_masked_render_matches_cpu():
    camera = make_camera()
    mask = torch.tensor([[True, False, True], [False, True, False]])
    cpu_out, cpu_grads = render_with_grads(make_gaussians(60, 2), camera, "cpu", tile_mask=mask)
    cuda_out, cuda_grads = render_with_grads(make_gaussians(60, 2), camera, "cuda", tile_mask=mask.cuda())
    pixel_mask = mask.repeat_interleave(TILE_SIZE, 0).repeat_interleave(TILE_SIZE, 1)[:HEIGHT, :WIDTH]
    torch.testing.assert_close(cuda_out.image.cpu()[pixel_mask], cpu_out.image.detach()[pixel_mask], atol=1e-4, rtol=0)
    # Alpha is defined everywhere: 0 outside the rendered tiles on both (gsplat leaves it unwritten).
    torch.testing.assert_close(cuda_out.alpha.cpu(), cpu_out.alpha.detach(), atol=1e-4, rtol=0)
    assert float(cuda_out.alpha.detach()[~pixel_mask.cuda()].abs().max()) == 0.0
    assert_grads_close(cpu_grads, cuda_grads)


def test_cuda_intersect_tiles_matches_cpu():
    gaussians = make_gaussians(60, 3)
    camera = make_camera()
    tile_height, tile_width = tile_grid(HEIGHT, WIDTH)
    mask = torch.tensor([[False, True, True], [True, False, True]])
    with torch.no_grad():
        radii, means2d, depths, _ = ops.project(
            gaussians.means, gaussians.quats, gaussians.scales, camera.world_to_cam, camera.K,
            WIDTH, HEIGHT, 0.01, 1e10, 0.3,
        )
    for tile_mask in (None, mask):
        cpu = ops.intersect_tiles(means2d, radii, depths, TILE_SIZE, tile_width, tile_height, tile_mask)
        cuda = ops.intersect_tiles(
            means2d.cuda(), radii.cuda(), depths.cuda(), TILE_SIZE, tile_width, tile_height,
            None if tile_mask is None else tile_mask.cuda(),
        )
        assert torch.equal(cuda[0].cpu(), cpu[0])
        assert torch.equal(cuda[1].cpu(), cpu[1])
