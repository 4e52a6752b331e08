"""A budget run's progress follows the steps it makes, not the seconds they take
(turbogs/training/progress.py), and the initial count fits what the run affords
(turbogs/training/init_size.py)."""


import pytest
import torch

from turbogs.data.scene import Camera, Scene
from turbogs.training import init_size
from turbogs.training.progress import WorkProgress


def simulate(seconds_per_step, budget=100.0, steps=100_000):
    """Run a WorkProgress through a budget with the given pace per step (a function of the step
    number); return [(step, elapsed, progress)]."""
    tracker, elapsed, step, seen = WorkProgress(steps, budget), 0.0, 0, []
    while True:
        progress = tracker.at(step, elapsed)
        seen.append((step, elapsed, progress))
        if progress >= 1.0:
            return seen
        elapsed += seconds_per_step(step)
        step += 1


def test_a_step_run_is_its_fraction_of_steps():
    tracker = WorkProgress(200)
    assert [tracker.at(s, 1e6) for s in (0, 50, 200, 300)] == [0.0, 0.25, 1.0, 1.0]


def test_a_steady_pace_gives_the_elapsed_fraction():
    for step, elapsed, progress in simulate(lambda step: 0.1)[5:-1]:
        assert progress == pytest.approx(elapsed / 100.0, abs=1e-6)


def test_a_tenfold_faster_pace_gives_the_fast_steps_the_schedule_by_their_count():
    """30 s of 0.75 s steps (many Gaussians, pruned early), then 0.075 s steps. By seconds, the 40
    slow steps take 30 % of every schedule and 63 % of it has passed when half the steps are made;
    by work, progress waits for the fast steps to catch up: half the steps, half the schedule."""
    seen = simulate(lambda step: 0.75 if step < 40 else 0.075)
    total = seen[-1][0]
    assert 970 <= total <= 975
    step, elapsed, progress = next(x for x in seen if x[0] == total // 2)
    assert elapsed / 100.0 > 0.6  # what progress by seconds would say
    assert 0.45 <= progress <= 0.55, progress
    progresses = [p for _, _, p in seen]
    assert all(b >= a for a, b in zip(progresses, progresses[1:])), "progress never goes back"
    assert progresses[-1] == 1.0 and seen[-1][1] >= 100.0  # the budget still ends the run


def test_a_slower_pace_still_ends_the_schedules_with_the_budget():
    seen = simulate(lambda step: 0.05 if step < 500 else 0.5)
    step, elapsed, progress = seen[-1]
    assert progress == 1.0 and 100.0 <= elapsed < 100.6
    assert seen[-2][2] > 0.9  # the schedules were nearly through when the budget ran out


def test_progress_resumes_from_its_state():
    first = WorkProgress(10_000, 50.0)
    for step in range(100):
        first.at(step, step * 0.1)
    second = WorkProgress(10_000, 50.0)
    second.load_state_dict(first.state_dict())
    assert second.at(150, 15.0) == first.at(150, 15.0)


def camera(width, height):
    return Camera(name="c", width=width, height=height, K=torch.eye(3), world_to_cam=torch.eye(4))


@pytest.mark.parametrize("views, width, height, device, budget, expected", [
    (20, 80, 80, "cpu", None, 8_000),  # 128k pixels / 16
    (100, 800, 800, "cpu", None, init_size.INRIA_RANDOM_POINTS),  # capped at INRIA's
    (100, 800, 800, "cuda", 100.0, init_size.INRIA_RANDOM_POINTS),  # a GPU affords it
    (100, 800, 800, "cpu", 100.0, 13_333),  # 100 s / (1000 steps x 7.5 us)
    (2, 40, 30, "cpu", None, init_size.MIN_POINTS),
])
def test_the_initial_count_follows_pixels_device_and_budget(views, width, height, device, budget, expected):
    scene = Scene(train=[camera(width, height)] * views)
    count, why = init_size.initial_count(scene, None, device, budget, None)
    assert count == expected and why


def test_the_initial_count_obeys_the_user_and_the_gaussian_budget():
    scene = Scene(train=[camera(800, 800)] * 100)
    assert init_size.initial_count(scene, 1234, "cpu", 100.0, None) == (1234, "as --init-points asks")
    count, why = init_size.initial_count(scene, None, "cuda", None, 5000)
    assert count == 5000 and "budget" in why


def test_a_budget_runs_bar_counts_seconds_of_the_budget_and_shows_the_step(tmp_path, capsys):
    from test_cli import small_demo

    from turbogs.data.load import load_scene
    from turbogs.training.config import get_preset
    from turbogs.training.trainer import SessionOptions, Trainer

    scene = load_scene(small_demo(tmp_path, views=4), log=lambda message: None)
    trainer = Trainer(scene, get_preset("turbo").for_run(budget_seconds=1.5),
                      SessionOptions(out_dir=tmp_path / "out", progress=True, log=lambda message: None))
    trainer.train()
    bar = capsys.readouterr().err
    assert "s of budget" in bar and "left]" in bar and f"step={trainer.step}" in bar
    assert "/2 s of budget" in bar and trainer.elapsed >= 1.5  # total shown rounded; the run used its budget
