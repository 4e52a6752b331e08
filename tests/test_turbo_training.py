"""TurboGS parts in the real training loop, on the embedded demo scene."""


import pytest
import torch

from test_cli import DEMO, small_demo
from turbogs.config import get_preset
from turbogs.data.load import load_scene
from turbogs.evaluate import evaluate_views
from turbogs.train import RunOptions, Trainer


def quiet(*_):
    pass


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    return load_scene(small_demo(tmp_path_factory.mktemp("turbo"), views=12), eval_split=True, log=quiet)


def test_sparse_error_guided_training_converges(scene, tmp_path):
    cfg = get_preset("turbo").for_run(steps=240)
    cfg.sampler.dense_until, cfg.sampler.sparse_from = 0.05, 0.2  # sparse for most of the run
    trainer = Trainer(scene, cfg, RunOptions(out_dir=tmp_path, progress=False, log=quiet))
    before = evaluate_views(trainer.gaussians, scene.test, trainer.background, lpips_note=False)["mean"]["psnr"]
    rendered_fraction, first_pass_error = [], None
    while trainer.progress() < 1.0:
        pick = trainer.pick(trainer.progress())
        if pick.tile_mask is not None:
            rendered_fraction.append(float(pick.tile_mask.float().mean()))
        trainer.run_step()
        if first_pass_error is None and trainer.memory.seen_fraction() == 1.0:
            first_pass_error = memory_mean(trainer.memory)
    after = evaluate_views(trainer.gaussians, scene.test, trainer.background, lpips_note=False)["mean"]["psnr"]

    assert min(rendered_fraction) <= 0.3, "the run never went sparse"
    assert after > before + 4.0, (before, after)
    # The error memory reflects the learning: tiles now err less than the first full pass saw.
    assert memory_mean(trainer.memory) < 0.7 * first_pass_error


def memory_mean(memory) -> float:
    values = torch.cat([memory.errors[v, : memory.num_tiles(v)] for v in range(memory.num_views)])
    return float(values[torch.isfinite(values)].mean())


def test_turbo_checkpoint_restores_error_memory_and_sampler(scene, tmp_path):
    cfg = get_preset("turbo").for_run(steps=30)
    first = Trainer(scene, cfg, RunOptions(out_dir=tmp_path, progress=False, log=quiet))
    for _ in range(15):
        first.run_step()
    state = {**first.state_dict(), "step": first.step}
    second = Trainer(scene, cfg, RunOptions(out_dir=tmp_path, progress=False, log=quiet))
    second.load_state_dict(state)
    assert torch.equal(second.memory.errors, first.memory.errors)
    a, b = first.pick(0.5), second.pick(0.5)
    assert a.view == b.view and torch.equal(a.tile_ids, b.tile_ids)


@pytest.mark.parametrize("optimizer", ["adam", "hybrid"])
def test_optimizers_run_in_the_loop_and_survive_densification(scene, tmp_path, optimizer):
    cfg = get_preset("turbo").for_run(steps=60)
    cfg.optimizer = optimizer
    cfg.error_density.densify_every = 10
    trainer = Trainer(scene, cfg, RunOptions(out_dir=tmp_path, progress=False, log=quiet))
    start = len(trainer.gaussians)
    while trainer.progress() < 1.0:
        trainer.run_step()
    assert len(trainer.gaussians) != start  # density control changed the rows under the optimizer
    assert trainer.stats.skipped_steps == 0
    for name, opt in trainer.optimizers.items():
        for value in opt.state[trainer.gaussians.params[name]].values():
            if torch.is_tensor(value) and value.dim() > 0:
                assert value.shape[0] == len(trainer.gaussians)


@pytest.mark.slow
def test_turbo_beats_3dgs_at_the_same_small_step_budget():
    """Issue 4's claim on the demo scene (28 train / 4 test views): given the same 300 steps,
    the turbo preset ends with a higher test PSNR than vanilla 3dgs, although most of its
    steps render only part of a view. Measured: 18.82 dB against 18.24 dB (seed 0), 18.54 against
    18.19 (seed 1); benchmarks/results/2026-12-03_cpu_sparsity_schedule.md."""
    demo = load_scene(DEMO, eval_split=True, log=quiet)
    psnr = {}
    for preset in ("turbo", "3dgs"):
        cfg = get_preset(preset).for_run(steps=300)
        trainer = Trainer(demo, cfg, RunOptions(out_dir=None, progress=False, log=quiet))
        while trainer.step < cfg.steps:
            trainer.run_step()
        psnr[preset] = evaluate_views(trainer.gaussians, demo.test, trainer.background, lpips_note=False)["mean"]["psnr"]
    assert psnr["turbo"] > psnr["3dgs"], psnr
