"""Coarse to fine: the plan of training sizes (turbogs/training/coarse_to_fine.py), the step-cost
model (step_costs.py), the stages' progress (progress.py), the resized views and error memory,
and the trainer switching sizes as planned."""

import math

import cv2
import numpy as np
import pytest
import torch

from turbogs.data.scene import Camera
from turbogs.training.bar import count_text
from turbogs.training.coarse_to_fine import (CoarseToFineConfig, Stage, budget_plan, downscaled_size, merge_costly,
                                             plan_stages, spectrum_energy, start_factor, steps_made, tilt,
                                             work_shares)
from turbogs.training.progress import WorkProgress
from turbogs.training.step_costs import StepCosts, fastest_in_rounds
from turbogs.training.views import TrainingViews, resize_area
from turbogs.turbo.sampling import ErrorMemory

# --- the spectrum and the work shares ---------------------------------------------------


def cosine_image(height, width, frequency, mean=0.5, amplitude=0.25):
    """A grey image: mean + amplitude cos(2 pi f x), f in cycles per pixel (along x)."""
    x = torch.arange(width, dtype=torch.float64)
    row = mean + amplitude * torch.cos(2 * math.pi * frequency * x)
    return row.expand(height, width)[..., None].expand(height, width, 3).float()


def test_the_spectrum_share_is_what_a_downscaled_image_can_hold():
    """DC and one cosine at 0.2 cycles per pixel: its two peaks hold amplitude/2 of the mean each
    (|F| = H W mean at 0, H W amplitude / 2 at +-f). Factors 1 and 2 (limits 0.5, 0.25 cycles per
    pixel) hold both; 3 and more (0.167) only the DC."""
    height, width, frequency, mean, amplitude = 40, 80, 0.2, 0.5, 0.25
    image = cosine_image(height, width, frequency, mean, amplitude)
    shares = spectrum_energy([image], [1, 2, 3, 8])
    dc_only = mean / (mean + amplitude)
    assert shares == pytest.approx([1.0, 1.0, dc_only, dc_only], abs=1e-5)


def test_work_shares_follow_the_log_energy_each_next_size_adds():
    """Start at 4 (E 0.25): the sizes begin at 0.5 x ln(E(f) / E(4)) / ln(1 / E(4)) of the work."""
    energy = {4: 0.25, 3: 0.4, 2: 0.6, 1: 1.0}
    stages = work_shares(energy, 4, 0.5)
    begins = [0.5 * math.log(energy[f] / 0.25) / math.log(4) for f in (4, 3, 2, 1)]
    assert [s.factor for s in stages] == [4, 3, 2, 1]
    assert [s.share for s in stages] == pytest.approx([begins[1] - begins[0], begins[2] - begins[1],
                                                       begins[3] - begins[2], 0.5])
    assert sum(s.share for s in stages) == pytest.approx(1.0)


def test_the_start_keeps_the_energy_and_the_smallest_side():
    energy = {1: 1.0, 2: 0.6, 3: 0.45, 4: 0.3, 5: 0.2}
    config = CoarseToFineConfig(enabled=True, min_side=10, max_factor=8)
    assert start_factor(energy, config, short_side=100) == 4  # 5 keeps under a quarter
    assert start_factor(energy, config, short_side=25) == 2  # 25 / 3 < 10 px
    assert start_factor(energy, CoarseToFineConfig(enabled=True, max_factor=3, min_side=10), 100) == 3


def test_small_images_and_a_switched_off_plan_train_at_full_size():
    image = cosine_image(96, 128, 0.05)
    assert plan_stages([image], 128, 96, CoarseToFineConfig(enabled=True)) == [Stage(1, 1.0)]  # 96 / 2 < 64
    assert plan_stages([image], 128, 96, CoarseToFineConfig(enabled=False, min_side=8)) == [Stage(1, 1.0)]
    stages = plan_stages([image], 128, 96, CoarseToFineConfig(enabled=True, min_side=16))
    assert stages[0].factor > 1 and stages[-1].factor == 1 and sum(s.share for s in stages) == pytest.approx(1)


# --- time: the budget plan ----------------------------------------------------------------


def cpu_like(factors, full_seconds=1.0):
    """A step's seconds in proportion to the pixels, plus a little fixed work."""
    return [0.002 + full_seconds / f ** 2 for f in factors]


def test_a_budget_that_affords_the_step_plan_keeps_it():
    """Costs a GPU has (flat enough) and a budget that makes the target: beta is 1, every size gets
    its share of the steps."""
    stages = [Stage(4, 0.2), Stage(2, 0.3), Stage(1, 0.5)]
    costs = [0.004, 0.005, 0.008]
    planned = budget_plan(stages, costs, 100.0, target_steps=3000)
    steps = [s.steps for s in planned]
    assert sum(s.seconds for s in planned) == pytest.approx(100.0)
    assert [n / sum(steps) for n in steps] == pytest.approx([0.2, 0.3, 0.5])


def test_a_budget_too_short_for_the_step_plan_moves_time_to_the_small_sizes():
    stages = [Stage(8, 0.1), Stage(4, 0.2), Stage(2, 0.2), Stage(1, 0.5)]
    costs = cpu_like([8, 4, 2, 1])
    planned = budget_plan(stages, costs, 100.0, target_steps=1500)
    assert sum(s.steps for s in planned) == pytest.approx(1500, rel=1e-3)  # exactly the target
    assert steps_made([s.share for s in stages], costs, 100.0, 1.0) < 1500  # which the step plan misses
    assert planned[-1].seconds < 50.0 and planned[-1].factor == 1  # full size still has its time


def test_the_same_planner_chooses_differently_on_a_device_a_hundred_times_faster():
    """One plan, two devices: the CPU's costs and the same costs 100x lower. The fast device keeps
    the step plan (beta 1) and spends most of its budget at full size; the slow one tilts."""
    stages = [Stage(8, 0.1), Stage(4, 0.2), Stage(2, 0.2), Stage(1, 0.5)]
    cpu = cpu_like([8, 4, 2, 1])
    gpu = [c / 100 for c in cpu]
    shares = [s.share for s in stages]
    assert tilt(shares, gpu, 100.0, 3000) == 1.0
    assert tilt(shares, cpu, 100.0, 3000) < 0.0
    slow, fast = budget_plan(stages, cpu, 100.0, 3000), budget_plan(stages, gpu, 100.0, 3000)
    assert fast[-1].seconds > 60.0 > slow[-1].seconds
    assert sum(s.steps for s in fast) > 5 * sum(s.steps for s in slow)


def test_a_size_not_cheaper_than_the_next_joins_it():
    stages = [Stage(4, 0.2), Stage(3, 0.1), Stage(2, 0.2), Stage(1, 0.5)]
    flat = merge_costly(stages, [0.01, 0.01, 0.011, 0.012], min_speedup=1.5)
    assert [(s.factor, round(s.share, 6)) for s in flat] == [(1, 1.0)]
    steep = merge_costly(stages, [0.01, 0.02, 0.04, 0.16], min_speedup=1.5)
    assert [(s.factor, round(s.share, 6)) for s in steep] == [(4, 0.2), (3, 0.1), (2, 0.2), (1, 0.5)]
    middle = merge_costly(stages, [0.03, 0.035, 0.04, 0.16], min_speedup=1.5)
    assert [(s.factor, round(s.share, 6)) for s in middle] == [(2, 0.5), (1, 0.5)]


def test_step_costs_fit_the_two_timings_and_follow_the_measured_pace():
    fixed, per_pixel = 0.003, 2e-7
    def measure(factors):
        return {f: fixed + per_pixel * (800 // f) * (600 // f) for f in factors}

    costs = StepCosts(800, 600, measure, 4, lambda p: 1.0)
    assert sorted(costs.measured) == [2, 4]
    assert costs.fixed == pytest.approx(fixed) and costs.per_pixel == pytest.approx(per_pixel)
    assert costs.predict(2, 0.5) == pytest.approx(fixed + per_pixel * 400 * 300)
    costs.observe(4, 0.2, 2 * costs.predict(4, 0.2))  # the steps cost twice the model
    assert costs.predict(1, 0.9) == pytest.approx(2 * (fixed + per_pixel * 800 * 600))
    sparse = StepCosts(800, 600, measure, 4, lambda p: 0.25)
    assert sparse.predict(1, 0.9) == pytest.approx(fixed + per_pixel * 800 * 600 / 4)


def test_step_timings_taken_in_rounds_share_a_busy_stretch():
    """A machine busy for the first 0.15 s slows every step three times: timed one size after the
    other, the small size's every try falls in it (a flat cost curve, which would merge every
    size); in rounds both sizes meet it and leave it, and the fastest of each is the true cost."""
    clock = [0.0]
    cost = {4: 0.01, 2: 0.03}

    def time_once(factor):
        seconds = cost[factor] * (3 if clock[0] < 0.15 else 1)
        clock[0] += seconds
        return seconds

    fastest = fastest_in_rounds(time_once, [4, 2], seconds=0.3)
    assert fastest == pytest.approx(cost)
    clock[0] = 0.0
    one_after_the_other = {f: fastest_in_rounds(time_once, [f], seconds=0.15)[f] for f in (4, 2)}
    assert one_after_the_other[4] == pytest.approx(3 * cost[4])  # what rounds guard against
    calls = []
    fastest_in_rounds(lambda f: calls.append(f) or 1.0, [4, 2])  # slow steps: the minimum of rounds
    assert calls == [4, 2] * 3


# --- the stages' progress -------------------------------------------------------------------


def test_a_step_run_changes_size_at_its_shares_of_the_steps():
    progress = WorkProgress(200, None, [Stage(4, 0.25), Stage(2, 0.25), Stage(1, 0.5)])
    switched = []
    for step in range(200):
        if progress.stage_over(step, 0.0):
            progress.next_stage(step, 0.0)
            switched.append((step, progress.stage.factor))
        assert progress.at(step, 0.0) == step / 200
    assert switched == [(50, 2), (100, 1)]


def test_a_budget_run_changes_size_at_its_planned_seconds_and_its_progress_follows_the_shares():
    """Two sizes: 30 s at 10 ms a step for a fifth of the work, then 70 s at 0.2 s a step. Progress
    rises through the first fifth with the cheap steps and never goes back."""
    progress = WorkProgress(100_000, 100.0, [Stage(2, 0.2, 30.0, 0.01), Stage(1, 0.8, 70.0, 0.2)])
    step, elapsed, seen, switched = 0, 0.0, [], None
    while True:
        if progress.stage_over(step, elapsed):
            progress.next_stage(step, elapsed)
            switched = (step, elapsed)
        value = progress.at(step, elapsed)
        seen.append(value)
        if value >= 1.0:
            break
        elapsed += 0.01 if progress.stage.factor == 2 else 0.2
        step += 1
    assert switched[0] == pytest.approx(3000, abs=2) and switched[1] == pytest.approx(30.0, abs=0.02)
    assert seen[1500] == pytest.approx(0.1, abs=0.01)  # half the small size: half its share
    assert all(b >= a for a, b in zip(seen, seen[1:]))
    assert elapsed >= 100.0 and step == pytest.approx(3000 + 350, abs=2)


def test_progress_resumes_its_stages():
    first = WorkProgress(10_000, 50.0, [Stage(2, 0.3, 10.0, 0.01), Stage(1, 0.7, 40.0, 0.1)])
    for step in range(1200):
        elapsed = step * 0.01
        if first.stage_over(step, elapsed):
            first.next_stage(step, elapsed)
        first.at(step, elapsed)
    second = WorkProgress(10_000, 50.0, [Stage(1, 1.0)])
    second.load_state_dict(first.state_dict())
    assert second.stage == first.stage and second.index == 1
    assert second.at(1300, 13.0) == first.at(1300, 13.0)


# --- the views and the memory at a size ----------------------------------------------------


def camera(width, height, focal=50.0):
    K = torch.tensor([[focal, 0.0, width / 2 - 3.0], [0.0, focal, height / 2 + 2.0], [0.0, 0.0, 1.0]])
    return Camera(name="c", width=width, height=height, K=K, world_to_cam=torch.eye(4))


def test_a_resized_camera_sees_each_point_where_the_resized_image_shows_it():
    """A point at the centre of full-size pixel block (i, j) of a factor-4 grid projects to the centre
    of pixel (i, j) of the quarter-size image."""
    full = camera(160, 120)
    small = full.resized(40, 30)
    for i, j in [(0, 0), (7, 3), (39, 29)]:
        u, v = 4 * i + 2.0, 4 * j + 2.0  # the block's centre in full-size pixel coordinates
        ray = torch.linalg.solve(full.K, torch.tensor([u, v, 1.0]))
        projected = small.K @ ray
        assert projected[:2].tolist() == pytest.approx([i + 0.5, j + 0.5], abs=1e-4)


def test_resized_views_average_each_pixel_footprint_as_the_loader_does():
    rng = np.random.default_rng(0)
    image = rng.random((64, 96, 3)).astype(np.float32)
    mask = (rng.random((64, 96)) > 0.3).astype(np.float32)
    views = TrainingViews([camera(96, 64)], [torch.from_numpy(image)], [torch.from_numpy(mask)], torch.device("cpu"))
    small = views.resized([(24, 16)])
    assert (small.cameras[0].width, small.cameras[0].height) == (24, 16)
    expected = cv2.resize(image, (24, 16), interpolation=cv2.INTER_AREA)
    assert small.images[0].numpy() == pytest.approx(expected, abs=1e-6)
    assert small.masks[0].numpy() == pytest.approx(cv2.resize(mask, (24, 16), interpolation=cv2.INTER_AREA), abs=1e-6)
    assert resize_area(torch.from_numpy(mask), 16, 24).shape == (16, 24)


def test_the_error_memory_carries_each_tile_to_the_tiles_it_becomes():
    memory = ErrorMemory([(64, 64)], ema_decay=0.5)  # 4 x 4 tiles
    memory.errors[0, :16] = torch.arange(16, dtype=torch.float32)
    memory.errors[0, 5] = float("inf")  # never seen stays never seen
    larger = memory.resized([(128, 128)])  # 8 x 8 tiles: each old tile becomes 2 x 2
    grid = larger.view_error(0)
    expected = memory.view_error(0).repeat_interleave(2, 0).repeat_interleave(2, 1)
    assert torch.equal(grid, expected)
    smaller = memory.resized([(32, 32)])  # 2 x 2 tiles: each takes the old tile under its centre
    assert smaller.view_error(0).tolist() == [[float("inf"), 7.0], [13.0, 15.0]]


def test_counts_read_as_people_read_them():
    assert [count_text(n) for n in (950, 15_600, 1_000_000, 2_345_678)] == ["950", "15.6k", "1.0M", "2.3M"]


def test_downscaled_sizes_round_as_the_loader_does():
    assert downscaled_size(1079, 1919, 8) == (135, 240)
    assert downscaled_size(5, 3, 8) == (1, 1)


# --- the trainer, switching sizes ------------------------------------------------------------


def quiet(*_):
    pass


@pytest.fixture(scope="module")
def demo_scene(tmp_path_factory):
    from test_cli import small_demo

    from turbogs.data.load import load_scene

    return load_scene(small_demo(tmp_path_factory.mktemp("c2f"), views=10), eval_split=True, log=quiet)


def small_sizes_config(**budget):
    """turbo on the 128 x 96 demo, whose images may shrink to a short side of 24 px (1/4)."""
    from turbogs.training.config import get_preset

    cfg = get_preset("turbo")
    cfg.coarse_to_fine.min_side = 24
    return cfg.for_run(**budget)


def test_a_step_run_trains_each_size_for_its_share_of_the_steps(demo_scene, tmp_path):
    from turbogs.training.trainer import SessionOptions, Trainer

    trainer = Trainer(demo_scene, small_sizes_config(steps=60), SessionOptions(out_dir=tmp_path, progress=False, log=quiet))
    stages = trainer.work.stages
    assert stages[0].factor == 4 and stages[-1].factor == 1
    seen = []
    while trainer.progress() < 1.0:
        trainer.timed_step()
        camera = trainer.train_views.cameras[0]
        seen.append((trainer.size_factor, camera.width, trainer.memory.grid(0), trainer.gaussians.antialiased))
    ends = [trainer.work.stage_end_step(i) for i in range(len(stages))]
    for step, (factor, width, grid, antialiased) in enumerate(seen):  # the factor of the step made as step + 1
        index = next(i for i, end in enumerate(ends) if step < end)
        assert factor == stages[index].factor, (step, factor, ends)
        assert width == downscaled_size(128, 96, factor)[0] and grid == ((96 // factor + 15) // 16, (width + 15) // 16)
        assert antialiased == (factor > 1)  # the small sizes' render mode; the model's own at full size
    assert trainer.summary()["steps"] == 60


def test_a_budget_run_plans_its_sizes_at_the_first_step_and_ends_at_full_size(demo_scene, tmp_path):
    from turbogs.training.trainer import SessionOptions, Trainer

    logs = []
    trainer = Trainer(demo_scene, small_sizes_config(budget_seconds=3.0),
                      SessionOptions(out_dir=tmp_path, progress=False, log=logs.append))
    trainer.train()
    planned = [line for line in logs if "a step measured" in line]
    assert planned and "full size 128x96" in planned[0]
    assert all(stage.seconds is not None for stage in trainer.work.stages)
    assert trainer.size_factor == 1 and trainer.elapsed >= 3.0 and not trainer.gaussians.antialiased


def test_a_resumed_run_goes_on_at_the_size_it_stopped_at(demo_scene, tmp_path):
    from turbogs.training.trainer import SessionOptions, Trainer

    cfg = small_sizes_config(steps=40)
    first = Trainer(demo_scene, cfg, SessionOptions(out_dir=tmp_path, progress=False, log=quiet))
    for _ in range(12):
        first.timed_step()
    assert 1 < first.size_factor < 4
    second = Trainer(demo_scene, cfg, SessionOptions(out_dir=tmp_path, progress=False, log=quiet))
    second.load_state_dict({**first.state_dict(), "step": first.step})
    assert second.size_factor == first.size_factor and torch.equal(second.memory.errors, first.memory.errors)
    for trainer in (first, second):
        while trainer.progress() < 1.0:
            trainer.timed_step()
    assert torch.equal(first.gaussians.means, second.gaussians.means)


@pytest.mark.slow
def test_small_sizes_trained_antialiased_do_not_alias_at_full_size(tmp_path):
    """A model trained at a quarter of the size, viewed at full size: with the small sizes rendered
    antialiased (Mip-Splatting's 2D filter) it scores higher there than without, where Gaussians
    under a pixel of the small images show as needles. Measured over seeds 0-2 at 300 steps:
    +0.62 to +0.91 dB; no filter in the small sizes would be 0."""
    from test_cli import small_demo

    from turbogs.data.load import load_scene
    from turbogs.evaluate import evaluate_views
    from turbogs.training import trainer as trainer_module
    from turbogs.training.config import get_preset
    from turbogs.training.trainer import SessionOptions, Trainer

    scene = load_scene(small_demo(tmp_path, views=32), eval_split=True, log=quiet)
    scores = {}
    with pytest.MonkeyPatch.context() as patch:  # every step at 1/4, then the model at full size
        patch.setattr(trainer_module, "run_stages", lambda cfg, views: [Stage(4, 0.99), Stage(1, 0.01)])
        for antialiased in (True, False):
            cfg = get_preset("turbo")
            cfg.coarse_to_fine.antialiased_small = antialiased
            trainer = Trainer(scene, cfg.for_run(steps=300), SessionOptions(out_dir=tmp_path, progress=False, log=quiet))
            while trainer.progress() < 1.0:
                trainer.timed_step()
            assert trainer.size_factor == 1 and not trainer.gaussians.antialiased  # viewed as a classic renderer would
            scores[antialiased] = evaluate_views(trainer.gaussians, scene.test, trainer.background,
                                                 lpips_note=False)["mean"]["psnr"]
    assert scores[True] >= scores[False] + 0.3, scores


def test_the_memory_estimate_counts_a_smaller_size_beside_the_full_one(demo_scene):
    """The views of the largest smaller size (half: a quarter of the pixels) live beside the
    full-size images while coarse to fine trains."""
    from turbogs.training.config import get_preset
    from turbogs.training.preflight import FLOAT_BYTES, estimate_memory

    cpu = torch.device("cpu")
    without = estimate_memory(demo_scene, get_preset("turbo+no-coarse-to-fine"), cpu).images
    train = sum(c.width * c.height * 3 for c in demo_scene.train) * FLOAT_BYTES
    assert estimate_memory(demo_scene, get_preset("turbo"), cpu).images == without + train // 4
