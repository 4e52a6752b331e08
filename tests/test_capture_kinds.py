"""The default preset on every kind of capture users bring, made by `scenes/make_captures.py`'s
independent ray caster (and the demo, COLMAP with points).

1. An object on white without points, where turbo used to train to fog, over the fixed white
   background (`--no-random-background`: random backgrounds keep it clear on their own,
   tests/test_random_background.py): the default against the same without error-driven
   density's opacity decay (what the default was), two runs in one process, so that no figure
   measured on one CPU is asserted. Measured (seed 0, 600 steps) with the hybrid optimizer: 17.92
   dB against 15.43; at 1000 steps 20.23 against 15.35
   (benchmarks/results/2026-12-05_cpu_capture_kinds.md); with Adam, the default since 2026-12-06:
   18.97 against 16.43 (`python benchmarks/config_variants.py SYNTHETIC:w turbo 600
   random_background=False [density.opacity_decay=1.0]`). Removing the decay fails this test. In
   the default the decay pays most on the forward-facing capture without points (2000 steps: 29.37
   dB against 26.52 without it; benchmarks/results/2026-12-06_cpu_random_background.md).
2. Every kind: turbo against 3dgs at equal steps, and turbo's default 100-second budget
   against a floor (benchmarks/results/2026-12-05_cpu_capture_kinds_2.md).
"""

import importlib.util

import pytest
from conftest import REPO

from turbogs.data.load import load_scene
from turbogs.evaluate import evaluate_views
from turbogs.training.config import get_preset
from turbogs.training.trainer import RunOptions, Trainer

_spec = importlib.util.spec_from_file_location("make_captures", REPO / "scenes" / "make_captures.py")
captures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(captures)

STEPS = 600
GAIN_DB = 1.0  # measured 2.5 dB; the margin covers another CPU's rounding


def quiet(*_):
    pass


def trained_psnr(scene, cfg, out_dir) -> float:
    """Train `scene` to the end of `cfg`; its test PSNR."""
    trainer = Trainer(scene, cfg, RunOptions(out_dir=out_dir, progress=False, log=quiet))
    while trainer.progress() < 1.0:
        trainer.run_step()
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


# --- every kind of capture: turbo against 3dgs at equal steps, and the default 100 s budget ---

EQUAL_STEPS = 500
BUDGET_SECONDS = 100.0
# capture -> (white background, how far turbo may trail 3dgs at EQUAL_STEPS, the budget run's floor), in dB.
# Measured on a 2-core Xeon, one thread a run, seeds 0 / 1, with turbo on Adam
# (benchmarks/results/2026-12-06_cpu_turbo_optimizer_default.md, section 4): turbo - 3dgs at 500 steps; turbo's
# 100 s runs (seed 0), two at once on the two cores (section 3 there; the floors date from the torch twins under
# heavier load, 2026-12-05_cpu_capture_kinds_2.md, and hold with room to spare).
# Issue 34's bar is a trail of 0.5 dB at most; where turbo does not meet it yet at 500 steps (every
# capture with points, and forward-facing without) the allowance is the worst trail measured plus 1 dB,
# so that this test holds what there is and fails on a regression; the floors are 3 dB or more under
# the 100 s runs. At 2000 steps turbo meets the bar on six captures of seven (synthetic: -0.72 / -0.14 / -0.64, seeds 0-2).
KINDS = {
    "demo": (False, 2.7, 18.0),  # COLMAP with points: -1.69 / -1.05; 29.39 dB in 100 s
    "forward_points": (False, 2.4, 23.0),  # transforms.json + points: -1.42 / -1.00; 31.11
    "masks": (False, 2.9, 23.0),  # passers-by masked out: -1.87 / -1.36; 29.99
    "forward": (False, 1.8, 17.5),  # forward-facing, no points: -0.42 / -0.75; 29.76
    # an object on white, no points: +3.66 / +3.19 with random backgrounds (+0.93 / +0.90 without); 26.86 in
    # 100 s (2026-12-06_cpu_random_background.md); the floor is 20, well above the fog it used to be (14.6)
    "synthetic": (True, 0.5, 20.0),
    "exposure": (False, 0.5, 11.5),  # photos with different exposures: -0.02 / +0.17; 15.01
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
