"""The default preset on every kind of capture users bring, made by `scenes/make_captures.py`'s
independent ray caster (and the demo, COLMAP with points). Each test runs what it compares in one
process, so no figure measured on one CPU is asserted; the margins and floors come from the runs
docs/RESULTS.md lists ("Turbo against 3dgs on every kind of capture", "Opacity decay").

1. An object on white without points, where turbo used to train to fog, over the fixed white
   background (`--no-random-background`: random backgrounds keep it clear on their own,
   tests/test_random_background.py): the default against the same without error-driven
   density's opacity decay. Removing the decay fails this test.
2. Background points keep the demo's sky off its cameras.
3. Every kind: turbo against 3dgs at equal steps, and turbo's default 100-second budget against a
   floor well under what it scores.
"""

import importlib.util

import pytest
from conftest import REPO

from turbogs.data.load import load_scene
from turbogs.evaluate import evaluate_views
from turbogs.training.config import get_preset
from turbogs.training.trainer import SessionOptions, Trainer

_spec = importlib.util.spec_from_file_location("make_captures", REPO / "scenes" / "make_captures.py")
captures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(captures)

STEPS = 600
GAIN_DB = 1.0  # measured 2.5 dB; the margin covers another CPU's rounding


def quiet(*_):
    pass


def trained_psnr(scene, cfg, out_dir) -> float:
    """Train `scene` to the end of `cfg`; its test PSNR."""
    trainer = Trainer(scene, cfg, SessionOptions(out_dir=out_dir, progress=False, log=quiet))
    while trainer.progress() < 1.0:
        trainer.timed_step()
    return evaluate_views(trainer.gaussians, scene.test, trainer.background, lpips_note=False)["mean"]["psnr"]


@pytest.mark.slow
def test_an_object_on_white_without_points_trains_clear_not_to_fog(tmp_path):
    folder = captures.make_capture("synthetic", str(tmp_path))
    scene = load_scene(folder, eval_split=True, white_background=True, log=quiet)
    assert scene.points is None  # started from points along the rays, sized by init_size
    default = get_preset("turbo+fixed-background")
    without_decay = get_preset("turbo+fixed-background")
    without_decay.density.opacity_decay = 1.0
    psnr = {name: trained_psnr(scene, cfg.for_run(steps=STEPS), tmp_path / name)
            for name, cfg in (("default", default), ("without decay", without_decay))}
    assert psnr["default"] >= psnr["without decay"] + GAIN_DB, psnr


@pytest.mark.slow
def test_background_points_keep_the_demos_sky_away_from_its_cameras(tmp_path):
    """The demo (an orbit under a sky) without background points grows its sky out of the subject's
    Gaussians, as blobs at the cameras' distance that one test camera sees as fog. Measured at 800
    steps over seeds 0-7: +1.40 to +2.42 dB with them (25.54-25.88 against 23.37-24.43;
    benchmarks/results/2026-12-06_cpu_background_points.md). Two runs in one process; removing the
    points (or putting them among the cameras) fails this."""
    scene = kind_scene("demo", tmp_path)
    psnr = {name: trained_psnr(scene, get_preset(name).for_run(steps=800), tmp_path / name)
            for name in ("turbo", "turbo+no-background-points")}
    assert psnr["turbo"] >= psnr["turbo+no-background-points"] + 0.7, psnr


# --- every kind of capture: turbo against 3dgs at equal steps, and the default 100 s budget ---

# 2000 steps: about what turbo's default 100 s makes on the CPU on these captures, so that the two presets are
# compared at the length of a run users make (at a few hundred steps dense 3dgs leads wherever there are points:
# its one densification of so short a run doubles the count).
EQUAL_STEPS = 2000
BUDGET_SECONDS = 100.0
# capture -> (white background, how far turbo may trail 3dgs at EQUAL_STEPS, the budget run's floor), in dB.
# The allowance is half a dB, or the worst trail over seeds 0-2 plus half a dB where a seed trailed by more
# (another CPU's rounding is another seed); the floors sit 3 dB or more under turbo's 100 s runs, taken two at
# once on two cores.
KINDS = {
    # COLMAP with points: -1.10 / -0.02 / +4.26 (mean +1.05) before turbo's background points (+1.50 since).
    # 3dgs grows a shell of sky-coloured blobs on this orbit and one test camera of four sits by it: it scored
    # 21.56 with seed 2; 29.39 dB in 100 s (31.75 with background points)
    "demo": (False, 2.1, 18.0),
    "forward_points": (False, 0.5, 23.0),  # transforms.json + points: +2.81 / +1.85 / +2.91; 31.11
    "masks": (False, 0.5, 23.0),  # passers-by masked out: +4.03 / +3.03 / +2.92; 29.99
    "forward": (False, 0.5, 17.5),  # forward-facing, no points: +1.99 / +3.02 / +2.88; 29.76
    # an object on white, no points: -0.73 / -0.14 / -0.64 with random backgrounds (mean -0.50; -3.5 over the
    # fixed white); 26.86 in 100 s (2026-12-06_cpu_random_background.md); the floor is 20, well above the fog
    # it used to be (14.6)
    "synthetic": (True, 1.2, 20.0),
    "exposure": (False, 0.5, 11.5),  # photos with different exposures: +0.53 / +0.43 / +1.45; 15.01
}


def kind_scene(kind: str, folder):
    path = REPO / "scenes" / "demo" if kind == "demo" else captures.make_capture(kind, str(folder))
    return load_scene(path, eval_split=True, white_background=KINDS[kind][0], log=quiet)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_turbo_keeps_up_with_3dgs_at_equal_steps_and_trains_in_its_default_budget(kind, tmp_path):
    """Both presets for EQUAL_STEPS in one process (so no CPU's rounding is asserted), 3dgs
    from the same sized start as turbo where the capture has no points (INRIA's 100k would
    take this test 10 minutes a run); then turbo as users run it, its 100 s budget, against a
    floor well under what it scored here under load (another CPU makes more or fewer steps)."""
    white, trail_db, floor_db = KINDS[kind]
    scene = kind_scene(kind, tmp_path)
    turbo, vanilla = get_preset("turbo"), get_preset("3dgs")
    vanilla.init_random_points = None  # sized like turbo's start (turbogs/training/init_size.py)
    psnr = {name: trained_psnr(scene, cfg.for_run(steps=EQUAL_STEPS), tmp_path / name)
            for name, cfg in (("turbo", turbo), ("3dgs", vanilla))}
    assert psnr["turbo"] >= psnr["3dgs"] - trail_db, psnr
    budget = trained_psnr(scene, get_preset("turbo").for_run(budget_seconds=BUDGET_SECONDS), tmp_path / "budget")
    assert budget >= floor_db, (budget, psnr)
