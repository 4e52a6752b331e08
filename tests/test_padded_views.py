"""Views of slightly different sizes (a capture downscaled by 8: 125x82 and 125x83 px) are
stacked padded to the largest size (turbogs/training/views.py): the turbo step then picks its
view on the device with no host read, and the padding counts for nothing."""

import dataclasses

import pytest
import torch
from test_cli import small_demo

from turbogs import host_read
from turbogs.bench.audit import AuditObserver, OpCounter
from turbogs.data.load import load_scene
from turbogs.render import render
from turbogs.tiles import sampled_pixel_values
from turbogs.training.config import get_preset
from turbogs.training.trainer import SessionOptions, Trainer
from turbogs.training.views import TrainingViews, can_pad


def quiet(*_):
    pass


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    """The demo capture (rendered by an independent ray tracer), every other view one row
    and one column smaller, as a downscale rounds them: K stays, the cut is at the far edge."""
    scene = load_scene(small_demo(tmp_path_factory.mktemp("padded"), views=8), eval_split=False, log=quiet)
    scene.train = [c if i % 2 else dataclasses.replace(c, width=c.width - 1, height=c.height - 1,
                                                      image=c.image[:-1, :-1].contiguous())
                   for i, c in enumerate(scene.train)]
    return scene


def test_can_pad_keeps_tile_grids_and_bounds_the_waste():
    assert can_pad([(125, 82), (125, 83)])
    assert not can_pad([(125, 80), (125, 83)])  # 80 rows are 5 tile rows, 83 are 6
    assert not can_pad([(100, 90), (120, 95)])  # the same grid, but 17% of the pixels padding
    assert can_pad([(64, 64)])


def test_turbo_steps_read_nothing_with_two_view_sizes(scene, tmp_path):
    cfg = get_preset("turbo").for_run(steps=300)
    trainer = Trainer(scene, cfg, SessionOptions(out_dir=tmp_path, progress=False, evaluate=False, log=quiet))
    assert trainer.train_views.stacked and trainer.train_views.padded
    counter = OpCounter()
    observer = AuditObserver(counter)
    trainer.observer = observer
    reads = []
    with counter:
        for _ in range(12):
            counter.reset()
            observer.density_stats = None
            batched = host_read.reads_so_far()
            with counter.in_section("step"):
                trainer.timed_step()
            if not (observer.density_stats and observer.density_stats.get("densified")):
                reads.append({**counter.reads, "tolist": host_read.reads_so_far() - batched})
    assert reads and all(not any(r.values()) for r in reads), reads


def loss_and_grads(trainer, camera, gt, mask, tile_ids, tile_mask):
    for param in trainer.gaussians.params.values():
        param.grad = None
    out = render(trainer.gaussians, camera, background=trainer.background, tile_mask=tile_mask)
    loss, tile_errors = trainer.tile_loss(out.image, gt, tile_ids, mask)
    loss.backward()
    return loss.detach(), tile_errors, {k: p.grad.clone() for k, p in trainer.gaussians.params.items()}


def keep_in_view(trainer, camera) -> None:
    """Keep the Gaussians whose centres project inside the camera's true image. The projection
    clamps the Jacobian of Gaussians far outside the field of view, whose limits follow the
    rendered size (as gsplat's): those would see the padded size's slightly wider limits."""
    means = trainer.gaussians.params["means"].detach()
    cam = means @ camera.world_to_cam[:3, :3].T + camera.world_to_cam[:3, 3]
    pixels = cam @ camera.K.T
    x, y = pixels[:, 0] / pixels[:, 2], pixels[:, 1] / pixels[:, 2]
    keep = (cam[:, 2] > 0.2) & (x > 2) & (y > 2) & (x < camera.width - 2) & (y < camera.height - 2)
    trainer.gaussians.replace({k: torch.nn.Parameter(p.detach()[keep]) for k, p in trainer.gaussians.params.items()})


def test_padding_contributes_nothing(scene, tmp_path):
    """A small view picked on the device (padded, masked) gives the loss, tile errors and
    gradients of the same view picked by its int (true size, no padding), whatever the
    padding holds (bit for bit between fills)."""
    cfg = get_preset("turbo").for_run(steps=100)
    trainer = Trainer(scene, cfg, SessionOptions(out_dir=tmp_path, progress=False, evaluate=False, log=quiet))
    views = trainer.train_views
    small = 0
    keep_in_view(trainer, views.cameras[small])
    assert views.cameras[small].height == views.height - 1
    rows, cols = trainer.memory.grid(small)
    tile_ids = torch.arange(0, rows * cols, 2)  # every other tile, the border ones among them
    tile_mask = torch.zeros(rows * cols, dtype=torch.bool)
    tile_mask[tile_ids] = True
    tile_mask = tile_mask.reshape(rows, cols)

    camera, gt, mask = views.get(small)
    assert mask is None and (camera.width, camera.height) == tuple(gt.shape[1::-1])
    expected = loss_and_grads(trainer, camera, gt, mask, tile_ids, tile_mask)
    first = None
    for fill in (0.0, 7.0, float("nan")):
        views.image_stack[small, -1, :] = fill  # the padded row and column
        views.image_stack[small, :, -1] = fill
        camera, gt, mask = views.get(torch.tensor(small))
        assert (camera.width, camera.height) == (views.width, views.height)
        assert mask[-1].sum() == 0 and mask[:, -1].sum() == 0 and mask[:-1, :-1].min() == 1
        got = loss_and_grads(trainer, camera, gt, mask, tile_ids, tile_mask)
        first = first or got
        assert torch.equal(got[0], first[0]) and torch.equal(got[1], first[1])
        assert all(torch.equal(got[2][key], first[2][key]) for key in got[2])
        torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(got[1], expected[1], rtol=1e-5, atol=1e-7)
        for key in expected[2]:
            torch.testing.assert_close(got[2][key], expected[2][key], rtol=1e-4, atol=1e-8, msg=key)

    # The curvature estimate's sampled pixels: the padding zeroed, as the true-size view's
    # partial border tiles are.
    with torch.no_grad():
        true_camera, _, _ = views.get(small)
        padded_camera, _, _ = views.get(torch.tensor(small))
        true_image = render(trainer.gaussians, true_camera, background=trainer.background).image
        padded_image = render(trainer.gaussians, padded_camera, background=trainer.background).image
    got = sampled_pixel_values(views.real_pixels_only(padded_image, torch.tensor(small)), tile_ids)
    torch.testing.assert_close(got, sampled_pixel_values(true_image, tile_ids), rtol=1e-5, atol=1e-6)
    assert views.real_pixels_only(padded_image, small) is padded_image


def test_true_sizes_kept_for_int_views_and_cameras(scene):
    images = [c.image for c in scene.train]
    views = TrainingViews(scene.train, images, [None] * len(images), torch.device("cpu"))
    for i, camera in enumerate(scene.train):
        got, gt, mask = views.get(i)
        assert (got.width, got.height) == (camera.width, camera.height) and mask is None
        assert torch.equal(gt, images[i]) and tuple(camera.image.shape[:2]) == (camera.height, camera.width)
