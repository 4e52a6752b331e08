"""Random backgrounds for photos with alpha (NeRF-synthetic RGBA): the ground truth is the photo
composited onto the same colour the render used, so that the model learns an empty background
instead of painting one (turbogs/training/views.py, TrainingViews.get)."""

import dataclasses

import pytest
import torch
from test_capture_kinds import captures, quiet

from turbogs.data.load import load_scene
from turbogs.render import render
from turbogs.training.config import get_preset
from turbogs.training.trainer import SessionOptions, Trainer
from turbogs.training.views import TrainingViews, photo_alphas


def rgba_views(sizes, seed=0):
    """Cameras whose images are random photos composited onto white at load, with their alphas;
    and the photos themselves, to composite by hand."""
    from turbogs.data.scene import Camera

    generator = torch.Generator().manual_seed(seed)
    cameras, photos = [], []
    for width, height in sizes:
        photo = torch.rand(height, width, 3, generator=generator)
        alpha = torch.rand(height, width, generator=generator)
        alpha[0, 0], alpha[-1, -1] = 0.0, 1.0
        image = photo * alpha[..., None] + 1.0 * (1 - alpha[..., None])
        cameras.append(Camera(name=f"v{len(cameras)}", width=width, height=height, K=torch.eye(3),
                              world_to_cam=torch.eye(4), image=image, alpha=alpha))
        photos.append((photo, alpha))
    return cameras, photos


@pytest.mark.parametrize("sizes", [[(32, 24)] * 3, [(64, 48), (63, 47), (64, 48)]], ids=["one size", "padded"])
def test_the_ground_truth_is_the_photo_over_the_background_asked_for(sizes):
    cameras, photos = rgba_views(sizes)
    white = torch.ones(3)
    views = TrainingViews(cameras, [c.image for c in cameras], [None] * len(cameras), torch.device("cpu"),
                          alphas=photo_alphas(cameras, "cpu"), background=white)
    assert views.stacked
    stack = views.alpha_stack.untyped_storage().data_ptr()  # on the CPU the cameras' alphas now point into it
    assert all(c.alpha.untyped_storage().data_ptr() == stack for c in cameras)
    green = torch.tensor([0.1, 0.8, 0.3])
    for index, (photo, alpha) in enumerate(photos):
        expected = photo * alpha[..., None] + green * (1 - alpha[..., None])
        for view in (index, torch.tensor(index)):  # a Python index, and one drawn on the device
            _, gt, _ = views.get(view, green)
            height, width = photo.shape[:2]
            assert torch.allclose(gt[:height, :width], expected, atol=1e-6)
            _, as_loaded, _ = views.get(view)  # no background: the image as loaded (on white)
            assert torch.allclose(as_loaded[:height, :width], cameras[index].image)


def test_backgrounds_are_random_colours_fixed_by_the_seed_and_the_step():
    cameras, _ = rgba_views([(16, 16)] * 2)
    white = torch.ones(3)

    def views(alphas, seed=0):
        return TrainingViews(cameras, [c.image for c in cameras], [None, None], torch.device("cpu"), alphas=alphas,
                             background=white, seed=seed)

    assert all(torch.equal(b, white) for b in views(None).backgrounds(7, 2))  # opaque photos: the scene's
    alphas = photo_alphas(cameras, "cpu")
    colours = torch.stack([b for step in range(50) for b in views(alphas).backgrounds(step, 2)])
    assert len(torch.unique(colours, dim=0)) == 100 and 0 <= colours.min() and colours.max() <= 1
    assert torch.equal(torch.stack(views(alphas).backgrounds(9, 2)), colours[18:20])  # a resumed run's
    assert not torch.equal(torch.stack(views(alphas, seed=1).backgrounds(9, 2)), colours[18:20])


def test_opaque_photos_and_no_alphas_leave_the_ground_truth_alone():
    cameras, _ = rgba_views([(16, 16)] * 2)
    opaque = [dataclasses.replace(c, alpha=None) for c in cameras]
    assert photo_alphas(opaque, "cpu") is None
    mixed = [cameras[0], opaque[1]]
    views = TrainingViews(mixed, [c.image for c in mixed], [None, None], torch.device("cpu"),
                          alphas=photo_alphas(mixed, "cpu"), background=torch.ones(3))
    _, gt, _ = views.get(1, torch.zeros(3))
    assert torch.equal(gt, mixed[1].image)  # the opaque view: every pixel is the photo's


def test_loading_keeps_the_alpha_of_a_composited_photo(tmp_path):
    scene = load_scene(captures.make_capture("synthetic", str(tmp_path)), white_background=True, log=quiet)
    camera = scene.train[0]
    assert camera.alpha is not None and camera.alpha.shape == camera.image.shape[:2]
    assert camera.alpha.min() == 0 and camera.alpha.max() == 1  # empty corners, the solid object


def test_the_memory_estimate_counts_the_alphas(tmp_path):
    from turbogs.training.preflight import FLOAT_BYTES, estimate_memory

    scene = load_scene(captures.make_capture("synthetic", str(tmp_path)), white_background=True, log=quiet)
    cpu = torch.device("cpu")
    fixed = estimate_memory(scene, get_preset("turbo+fixed-background+no-coarse-to-fine"), cpu).images
    alphas = sum(c.width * c.height for c in scene.train) * FLOAT_BYTES
    assert estimate_memory(scene, get_preset("turbo+no-coarse-to-fine"), cpu).images == fixed + alphas


@pytest.mark.slow
def test_random_backgrounds_keep_the_background_empty(tmp_path):
    """Trained on white, a model may paint the white background with Gaussians; trained on
    random colours, it cannot, so where the photos are transparent it renders almost nothing on
    black (measured: mean brightness 0.019 against 0.78). Two runs in one process: the same
    capture, steps and seed."""
    scene = load_scene(captures.make_capture("synthetic", str(tmp_path)), eval_split=True, white_background=True,
                       log=quiet)
    coverage = {}
    for random_background in (False, True):
        cfg = dataclasses.replace(get_preset("turbo"), random_background=random_background).for_run(steps=400)
        trainer = Trainer(scene, cfg, SessionOptions(out_dir=tmp_path / str(random_background), progress=False,
                                                 log=quiet))
        assert (trainer.train_views.alphas is not None) == random_background
        while trainer.progress() < 1.0:
            trainer.timed_step()
        empty = [(camera, camera.alpha < 0.01) for camera in scene.test]
        with torch.no_grad():  # rendered on black: what shows there is the model's own opacity
            coverage[random_background] = sum(
                float(render(trainer.gaussians, camera, background=torch.zeros(3)).image.mean(-1)[where].mean())
                for camera, where in empty) / len(empty)
    assert coverage[True] < 0.5 * coverage[False], coverage


@pytest.mark.parametrize("flags, preset, expected", [([], "turbo", True), (["--no-random-background"], "turbo", False),
                                                      ([], "3dgs", False), (["--random-background"], "3dgs", True)])
def test_the_flag_overrides_the_preset(flags, preset, expected):
    from turbogs.cli import build_parser
    from turbogs.cli.train import apply_ablations

    args = build_parser().parse_args(["train", "scene", "--preset", preset, *flags])
    cfg = get_preset(args.preset)
    apply_ablations(cfg, args)
    assert cfg.random_background is expected
