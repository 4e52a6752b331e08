"""TurboGS parts in the real training loop, on the embedded demo scene."""


import pytest
import torch
from test_cli import DEMO, small_demo

from turbogs.data.load import load_scene
from turbogs.evaluate import evaluate_views
from turbogs.training.config import OPTIMIZER_CONFIGS, get_preset
from turbogs.training.trainer import SessionOptions, Trainer


def quiet(*_):
    pass


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    return load_scene(small_demo(tmp_path_factory.mktemp("turbo"), views=12), eval_split=True, log=quiet)


def test_sparse_error_guided_training_converges(scene, tmp_path):
    cfg = get_preset("turbo").for_run(steps=240)
    cfg.sampler.dense_until, cfg.sampler.sparse_from = 0.05, 0.2  # sparse for most of the run
    trainer = Trainer(scene, cfg, SessionOptions(out_dir=tmp_path, progress=False, log=quiet))
    before = evaluate_views(trainer.gaussians, scene.test, trainer.background, lpips_note=False)["mean"]["psnr"]
    rendered_fraction, first_pass_error = [], None
    while trainer.progress() < 1.0:
        pick = trainer.pick(trainer.progress())[0]  # the step's one view
        if pick.tile_mask is not None:
            rendered_fraction.append(float(pick.tile_mask.float().mean()))
        trainer.timed_step()
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
    first = Trainer(scene, cfg, SessionOptions(out_dir=tmp_path, progress=False, log=quiet))
    for _ in range(15):
        first.timed_step()
    state = {**first.state_dict(), "step": first.step}
    second = Trainer(scene, cfg, SessionOptions(out_dir=tmp_path, progress=False, log=quiet))
    second.load_state_dict(state)
    assert torch.equal(second.memory.errors, first.memory.errors)
    (a,), (b,) = first.pick(0.5), second.pick(0.5)
    assert a.view == b.view and torch.equal(a.tile_ids, b.tile_ids)


@pytest.mark.parametrize("optimizer", ["adam", "hybrid"])
def test_optimizers_run_in_the_loop_and_survive_densification(scene, tmp_path, optimizer):
    cfg = get_preset("turbo").for_run(steps=60)
    cfg.optimizer = OPTIMIZER_CONFIGS[optimizer]()
    cfg.density.densify_every = 10
    trainer = Trainer(scene, cfg, SessionOptions(out_dir=tmp_path, progress=False, log=quiet))
    start = len(trainer.gaussians)
    while trainer.progress() < 1.0:
        trainer.timed_step()
    assert len(trainer.gaussians) != start  # density control changed the rows under the optimizer
    assert trainer.stats.skipped_steps == 0
    for name, opt in trainer.optimizers.items():
        for value in opt.state[trainer.gaussians.params[name]].values():
            if torch.is_tensor(value) and value.dim() > 0:
                assert value.shape[0] == len(trainer.gaussians)


def test_turbo_preset_has_its_measured_parts_on():
    """All four parts on: the hybrid optimizer, curving the means only, over a means' rate twice
    INRIA's; Adam (at the same rates) is one ablation away."""
    cfg = get_preset("turbo")
    assert cfg.error_guided and cfg.sampler.fraction_end < 1.0  # sparse tiles
    assert cfg.tile_loss.lambda_ncc > 0  # the NCC structure loss
    assert cfg.density.name == "error"
    assert cfg.optimizer.name == "hybrid" and cfg.optimizer.curvature_on == ("means",)
    assert cfg.optimizer.max_shortening == 1.0  # the curvature only lengthens steps
    inria = get_preset("3dgs").lr
    assert cfg.lr.means == 2 * inria.means and cfg.lr.means_final == 2 * inria.means_final
    assert (cfg.lr.sh0, cfg.lr.opacities, cfg.lr.scales, cfg.lr.quats) == (inria.sh0, inria.opacities, inria.scales,
                                                                          inria.quats)
    adam = get_preset("turbo+optimizer-adam")
    assert adam.optimizer.name == "adam" and adam.lr == cfg.lr
    # photos with alpha train over random colours (tests/test_random_background.py); 3dgs is INRIA's
    assert cfg.random_background and not get_preset("3dgs").random_background
    assert not get_preset("turbo+fixed-background").random_background


def test_hybrid_in_the_loop_curves_the_means_of_rendered_gaussians_only(scene, tmp_path):
    """The curvature estimate reaches the means' optimizer only, and only the rows the step
    rendered: folding an unseen Gaussian's zero estimate in would shrink its curvature and
    lengthen its Newton steps (it cost 1.3 dB on test_colmap)."""
    cfg = get_preset("turbo+optimizer-hybrid").for_run(steps=30)
    cfg.optimizer.hessian_every = 1
    trainer = Trainer(scene, cfg, SessionOptions(out_dir=tmp_path, progress=False, log=quiet))
    means = trainer.optimizers["means"]
    folds = []

    def recording_update(estimates, visible=None, ok=None):
        state = means.state[trainer.gaussians.params["means"]]
        before = state["hessian"].clone()
        fold_in(estimates, visible=visible, ok=ok)
        folds.append((visible.clone(), before, state["hessian"].clone()))

    fold_in, means.update_hessian = means.update_hessian, recording_update
    while trainer.progress() < 1.0:
        trainer.timed_step()
    assert len(folds) == 30
    unseen_rows = 0
    for visible, before, after in folds:
        assert torch.equal(after[~visible], before[~visible])
        assert bool((after[visible] != before[visible]).any())
        unseen_rows += int((~visible).sum())
    assert unseen_rows > 0  # some steps did not render every Gaussian
    assert float(means.state[trainer.gaussians.params["means"]]["kappa"]) > 0  # calibrated
    for name, optimizer in trainer.optimizers.items():
        if name != "means":  # plain fused Adam, with no curvature state at all
            assert optimizer.defaults["fused"] and "hessian" not in optimizer.state[trainer.gaussians.params[name]], name


@pytest.mark.slow
def test_turbo_beats_3dgs_at_the_same_small_step_budget():
    """Issue 4's claim on the demo scene (28 train / 4 test views): given the same 150 steps,
    the turbo preset ends with a higher test PSNR than vanilla 3dgs, although most of its
    steps render only part of a view. Measured: 15.96 dB against 15.28 (seed 0), 15.63 against
    15.24 (seed 1), in 8.8 s against 12.6 s. The per-step lead is an early one: at 200 steps the
    two tie and from 300 steps dense 3dgs leads per step on this scene (turbo's lead is per
    second); benchmarks/results/2026-12-03_cpu_hybrid_calibrated.md."""
    demo = load_scene(DEMO, eval_split=True, log=quiet)
    psnr = {}
    for preset in ("turbo", "3dgs"):
        cfg = get_preset(preset).for_run(steps=150)
        trainer = Trainer(demo, cfg, SessionOptions(out_dir=None, progress=False, log=quiet))
        while trainer.step < cfg.steps:
            trainer.timed_step()
        psnr[preset] = evaluate_views(trainer.gaussians, demo.test, trainer.background, lpips_note=False)["mean"]["psnr"]
    assert psnr["turbo"] > psnr["3dgs"], psnr


def test_density_stats_reach_the_progress_bar_and_the_viewer(scene, tmp_path):
    """The strategy's after_backward stats are kept, not thrown away: grown / pruned / budget
    add up over the run and are what progress_stats hands the viewer's panel."""
    from turbogs.viewer.live import Snapshot, status_markdown

    cfg = get_preset("turbo").for_run(steps=30)
    cfg.density.densify_every = 10
    trainer = Trainer(scene, cfg, SessionOptions(out_dir=tmp_path, progress=False, log=quiet))
    start = len(trainer.gaussians)
    while trainer.progress() < 1.0:
        trainer.timed_step()
    stats = trainer.progress_stats()
    assert stats["grown"] > 0 and stats["budget"] >= len(trainer.gaussians)
    assert len(trainer.gaussians) == start + stats["grown"] - stats["pruned"]  # split_into 2: a split adds one row
    panel = status_markdown(Snapshot(step=trainer.step, total_steps=30, elapsed=1.0, stats=stats, final=False), "done")
    assert f"**Grown** {stats['grown']:,}" in panel and f"**Budget** {stats['budget']:,}" in panel
