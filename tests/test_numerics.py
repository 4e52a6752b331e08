"""Numerical safety: a step with a non-finite loss or gradient changes nothing and is counted;
a run that keeps producing them stops with a TurboGSError and keeps a loadable checkpoint."""

import pytest
import torch
from test_cli import small_demo

import turbogs.training.trainer as train_module
from turbogs.data.load import load_scene
from turbogs.errors import TurboGSError
from turbogs.training import checkpoint
from turbogs.training.config import get_preset
from turbogs.training.session import train
from turbogs.training.trainer import SessionOptions, Trainer


def quiet(*_):
    pass


class NanGradient(torch.autograd.Function):
    """Identity forward, NaN backward: a finite loss whose gradients are poisoned."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return torch.full_like(grad, float("nan"))


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    return load_scene(small_demo(tmp_path_factory.mktemp("num"), views=3), eval_split=False, log=quiet)


def poison(monkeypatch, bad_steps, how):
    real = train_module.photometric_loss

    def loss(image, gt, mask, lambda_ssim, trainer_step=[0]):
        step = trainer_step[0]
        trainer_step[0] += 1
        if step not in bad_steps:
            return real(image, gt, mask, lambda_ssim)
        if how == "loss":
            return real(image, gt, mask, lambda_ssim) * float("nan")
        return real(NanGradient.apply(image), gt, mask, lambda_ssim)

    monkeypatch.setattr(train_module, "photometric_loss", loss)


@pytest.mark.parametrize("how", ["loss", "gradient"])
def test_a_non_finite_step_is_skipped_and_counted(scene, tmp_path, monkeypatch, how):
    poison(monkeypatch, {2}, how)
    trainer = Trainer(scene, get_preset("3dgs").for_run(steps=10), SessionOptions(out_dir=tmp_path, progress=False, log=quiet))
    trainer.timed_step()
    trainer.timed_step()
    before = {k: v.clone() for k, v in trainer.gaussians.raw().items()}
    trainer.timed_step()  # the poisoned one
    trainer.read_device_figures()  # the count lives on the device until read
    assert trainer.stats.skipped_steps == 1 and trainer.bad_streak == 1
    for name, value in trainer.gaussians.raw().items():
        assert torch.equal(value, before[name]), name
    assert all(p.grad is None for p in trainer.gaussians.params.values())
    trainer.timed_step()
    trainer.read_device_figures()
    assert trainer.bad_streak == 0 and trainer.stats.skipped_steps == 1
    assert not torch.equal(trainer.gaussians.raw()["means"], before["means"])
    assert all(torch.isfinite(v).all() for v in trainer.gaussians.raw().values())


@pytest.mark.parametrize("first_bad", [5, 0])
def test_too_many_bad_steps_stop_the_run_and_keep_a_good_checkpoint(scene, tmp_path, monkeypatch, first_bad):
    monkeypatch.setattr(train_module, "MAX_BAD_STEPS", 3)
    poison(monkeypatch, set(range(first_bad, 100)), "loss")
    cfg = get_preset("3dgs").for_run(steps=40)
    cfg.checkpoint_every_steps = 2
    with pytest.raises(TurboGSError, match="training diverged: 3 steps in a row"):
        train(scene, cfg, SessionOptions(out_dir=tmp_path, progress=False, evaluate=False, log=quiet))
    kept = checkpoint.list_checkpoints(tmp_path)
    assert kept, "no checkpoint was kept"
    state = checkpoint.load_latest_checkpoint(tmp_path, warn=quiet)
    assert state["step"] <= first_bad + 3
    assert all(torch.isfinite(v).all() for v in state["params"].values())
    resumed = Trainer(scene, cfg, SessionOptions(out_dir=tmp_path, progress=False, log=quiet))
    resumed.load_state_dict(state)  # and it loads into a trainer
    assert resumed.step == state["step"]
