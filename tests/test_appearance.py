"""Per-photo appearance (--appearance), the colour-corrected PSNR, and masked figures."""

import importlib.util
import json
import math

import numpy as np
import pytest
import torch
from conftest import REPO

from turbogs.data.load import load_scene
from turbogs.data.scene import Camera
from turbogs.errors import TurboGSError
from turbogs.evaluate import evaluate_views
from turbogs.gaussians import Gaussians
from turbogs.metrics import affine_color_fit, sampled_psnr
from turbogs.render import render
from turbogs.training.appearance import Appearance, AppearanceConfig
from turbogs.training.config import get_preset
from turbogs.training.session import train
from turbogs.training.trainer import SessionOptions, Trainer

_spec = importlib.util.spec_from_file_location("make_captures", REPO / "scenes" / "make_captures.py")
captures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(captures)

M = torch.tensor([[0.7, 0.1, 0.0], [0.05, 0.9, 0.1], [0.0, 0.1, 1.2]])
B = torch.tensor([0.05, -0.02, 0.03])


def quiet(*_):
    pass


def test_affine_fit_recovers_a_colour_transform_and_ignores_masked_pixels():
    g = torch.Generator().manual_seed(0)
    image = 0.2 + 0.5 * torch.rand(20, 30, 3, generator=g)
    gt = image @ M.T + B  # stays inside [0, 1]: the fit is exact
    torch.testing.assert_close(affine_color_fit(image, gt), gt, atol=1e-5, rtol=0)
    mask = torch.ones(20, 30)
    mask[:, :10] = 0
    spoiled = gt.clone()
    spoiled[:, :10] = torch.rand(20, 10, 3, generator=g)
    fitted = affine_color_fit(image, spoiled, mask)
    torch.testing.assert_close(fitted[:, 10:], gt[:, 10:], atol=1e-5, rtol=0)


def test_appearance_starts_at_identity_and_learns_a_photos_colour_cast():
    appearance = Appearance(3, AppearanceConfig(enabled=True, lr=0.02, weight=1e-4))
    image = 0.2 + 0.5 * torch.rand(16, 16, 3, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(appearance(image, 1), image)
    assert float(appearance.regularizer(1).detach()) == 0.0
    target = image @ M.T + B
    for _ in range(600):
        loss = (appearance(image, 1) - target).abs().mean() + appearance.regularizer(1)
        loss.backward()
        appearance.step()
    torch.testing.assert_close(appearance.matrices[1].detach(), M, atol=0.03, rtol=0)
    torch.testing.assert_close(appearance.biases[1].detach(), B, atol=0.03, rtol=0)
    # The mean transform stays the identity: a cast common to all photos belongs to the scene.
    torch.testing.assert_close(torch.stack(list(appearance.matrices)).detach().mean(0), torch.eye(3), atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.stack(list(appearance.biases)).detach().mean(0), torch.zeros(3), atol=1e-6, rtol=0)


def test_a_cast_shared_by_every_photo_stays_in_the_scene():
    """Every photo 20 % darker: nothing for the per-photo transforms to explain, so they stay
    at the identity (without the re-centring they drift together and the scene the other way)."""
    appearance = Appearance(4, AppearanceConfig(enabled=True, lr=0.02, weight=1e-4))
    image = 0.2 + 0.5 * torch.rand(16, 16, 3, generator=torch.Generator().manual_seed(4))
    for step in range(400):
        view = step % 4
        ((appearance(image, view) - 0.8 * image).abs().mean() + appearance.regularizer(view)).backward()
        appearance.step()
    for matrix in appearance.matrices:
        torch.testing.assert_close(matrix.detach(), torch.eye(3), atol=1e-5, rtol=0)


def test_regulariser_pulls_towards_identity():
    strong = Appearance(2, AppearanceConfig(enabled=True, lr=0.02, weight=10.0))
    image = torch.rand(8, 8, 3, generator=torch.Generator().manual_seed(2))
    for _ in range(200):
        ((strong(image, 0) - 0.5 * image).abs().mean() + strong.regularizer(0)).backward()
        strong.step()
    assert float((strong.matrices[0].detach() - torch.eye(3)).abs().max()) < 0.05
    weak = Appearance(2, AppearanceConfig(enabled=True, lr=0.02, weight=1e-4))
    for _ in range(200):
        ((weak(image, 0) - 0.5 * image).abs().mean() + weak.regularizer(0)).backward()
        weak.step()
    assert float((weak.matrices[0].detach() - torch.eye(3)).abs().max()) > 0.2  # the pull is what held it


def test_presets_keep_appearance_off():
    assert get_preset("3dgs").appearance.enabled is False
    assert get_preset("turbo").appearance.enabled is False


def small_camera(gaussians_image_size=(24, 32)):
    h, w = gaussians_image_size
    K = torch.tensor([[30.0, 0, w / 2], [0, 30.0, h / 2], [0, 0, 1]])
    return Camera(name="v.png", width=w, height=h, K=K, world_to_cam=torch.eye(4))


def test_evaluation_psnr_counts_valid_pixels_and_psnr_cc_undoes_a_colour_cast():
    g = torch.Generator().manual_seed(3)
    points = torch.rand(300, 3, generator=g) * torch.tensor([2.0, 1.5, 1.0]) + torch.tensor([-1.0, -0.75, 2.5])
    gaussians = Gaussians.from_points(points, torch.rand(300, 3, generator=g), sh_degree=0)
    camera = small_camera()
    background = torch.zeros(3)
    rendered = render(gaussians, camera, background=background).image.detach().clamp(0, 1)
    mask = torch.ones(24, 32)
    mask[:, :16] = 0
    camera.mask = mask
    camera.image = (rendered + 0.1).clamp(max=2)  # off by exactly 0.1 where it counts (20 dB)...
    camera.image[:, :16] = torch.rand(24, 16, 3, generator=g)  # ...and garbage where the mask drops it
    entry = evaluate_views(gaussians, [camera], background, lpips_note=False)["per_view"]["v.png"]
    assert entry["psnr"] == pytest.approx(20.0, abs=1e-4)  # not inflated by the masked half
    assert entry["psnr_cc"] > 60  # a bias is an affine colour map: the fit removes it

    camera.mask, camera.image = None, rendered * 0.6 + 0.1  # a darker, lifted photo
    entry = evaluate_views(gaussians, [camera], background, lpips_note=False)["per_view"]["v.png"]
    assert entry["psnr"] < 30 < 60 < entry["psnr_cc"]


def test_progress_bar_psnr_ignores_masked_out_pixels():
    image = torch.full((16, 16, 3), 0.5)
    gt = image + 0.1
    mask = torch.ones(16, 16)
    mask[8:] = 0
    gt[8:] = 1.0  # far off, but masked out
    assert sampled_psnr(image, gt, None, mask) == pytest.approx(20.0, abs=1e-4)
    assert sampled_psnr(image, gt, None) < 15  # what the bar showed before
    assert sampled_psnr(image, gt, None, torch.zeros(16, 16)) is None  # nothing valid: no figure


@pytest.fixture(scope="module")
def exposure_scene(tmp_path_factory):
    folder = captures.make_capture("exposure", str(tmp_path_factory.mktemp("captures")))
    return load_scene(folder, eval_split=True, log=quiet)


def appearance_cfg(steps):
    cfg = get_preset("3dgs").for_run(steps=steps)
    cfg.appearance.enabled = True
    return cfg


def test_checkpoint_keeps_the_transforms_and_resume_must_agree(exposure_scene, tmp_path):
    cfg = appearance_cfg(20)
    first = Trainer(exposure_scene, cfg, SessionOptions(out_dir=tmp_path, progress=False, log=quiet))
    for _ in range(8):
        first.timed_step()
    moved = [i for i, m in enumerate(first.appearance.matrices) if not torch.equal(m.detach(), torch.eye(3))]
    assert moved, "training did not touch any transform"
    state = {**first.state_dict(), "step": first.step}
    second = Trainer(exposure_scene, cfg, SessionOptions(out_dir=tmp_path, progress=False, log=quiet))
    second.load_state_dict(state)
    for a, b in zip(first.appearance.parameters(), second.appearance.parameters()):
        assert torch.equal(a, b)
    assert second.appearance.optimizer.state_dict()["state"].keys() == first.appearance.optimizer.state_dict()["state"].keys()
    plain = Trainer(exposure_scene, get_preset("3dgs").for_run(steps=20), SessionOptions(out_dir=tmp_path, progress=False, log=quiet))
    with pytest.raises(TurboGSError, match="--appearance"):
        plain.load_state_dict(state)


def test_training_writes_transforms_and_an_uncorrected_model(exposure_scene, tmp_path):
    summary = train(exposure_scene, appearance_cfg(12), SessionOptions(out_dir=tmp_path, progress=False, log=quiet,
                                                                   save_test_images=False))
    assert {"psnr", "psnr_cc"} <= summary.keys() and summary["psnr_cc"] >= summary["psnr"] - 1e-6
    saved = json.loads((tmp_path / "appearance.json").read_text())
    assert set(saved) == {c.name for c in exposure_scene.train}
    assert np.asarray(next(iter(saved.values()))["matrix"]).shape == (3, 3)
    per_view = json.loads((tmp_path / "per_view.json").read_text())
    assert all(math.isfinite(v["psnr_cc"]) for v in per_view.values())
