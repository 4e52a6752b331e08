"""What every benchmark shares, without training: `--set FIELD=VALUE` settings on a config
(turbogs/bench/settings.py), the scene form `[NAME=]PATH[:r=R][:w][:FIELD=VALUE ...]`
(turbogs/bench/scenes.py), the Gaussian count read through the StepObserver (counts.py), and
a trainer placed inside a run (step_trainer.py)."""

import json
from pathlib import Path

import pytest

from turbogs.bench.counts import GaussianCounts
from turbogs.bench.scenes import SceneSpec, parse_scene_spec, without_settings
from turbogs.bench.settings import apply_settings, config_record
from turbogs.errors import InputError
from turbogs.training.config import get_preset

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "scenes" / "demo"


def test_settings_reach_into_the_parts_as_typed_values():
    cfg = apply_settings(get_preset("turbo"), ["seed=3", "density.opacity_decay=0.8", "sampler.gamma=2",
                                               "coarse_to_fine.target_steps=2000", "antialiased=True"])
    assert (cfg.seed, cfg.density.opacity_decay, cfg.coarse_to_fine.target_steps, cfg.antialiased) == (3, 0.8, 2000, True)
    assert cfg.sampler.gamma == 2.0 and isinstance(cfg.sampler.gamma, float)  # an int where a float is wanted


def test_a_part_swapped_by_name_starts_at_its_defaults_and_later_settings_edit_it():
    cfg = apply_settings(get_preset("turbo"), ["density.opacity_decay=0.5", "density=mcmc", "density.max_gaussians=500",
                                               "optimizer=hybrid"])
    assert type(cfg.density).__name__ == "McmcDensityConfig" and cfg.density.max_gaussians == 500
    assert type(cfg.optimizer).__name__ == "HybridConfig"
    record = config_record(cfg)
    assert record["density"]["kind"] == "mcmc" and record["optimizer"]["kind"] == "hybrid"
    json.dumps(record)  # plain data


@pytest.mark.parametrize("item, message", [
    ("density.no_such_field=1", "density (ErrorDensityConfig) has no field 'no_such_field' (fields: densify_from"),
    ("no_such_field=1", "TrainConfig has no field 'no_such_field'"),
    ("nope.x=1", "TrainConfig has no part 'nope' (parts: lr, loss"),
    ("seed.x=1", "TrainConfig has no part 'seed'"),
    ("density=bogus", "no density named 'bogus' (choose from: 3dgs, error, mcmc)"),
    ("optimizer=bogus", "no optimizer named 'bogus'"),
    ("seed=abc", "'abc' is not a Python literal"),
    ("seed=1.5", "wants an int, got 1.5"),
    ("antialiased=1", "wants a bool, got 1"),
    ("density.opacity_decay='x'", "wants a float, got 'x'"),
    ("steps=500", "steps sizes the run; use --steps N or --budget-seconds S"),
    ("budget_seconds=5", "budget_seconds sizes the run"),
    ("seed", "expected FIELD=VALUE"),
])
def test_a_setting_that_does_not_apply_is_one_line_naming_it(item, message):
    with pytest.raises(InputError) as raised:
        apply_settings(get_preset("turbo"), [item])
    text = str(raised.value)
    assert message in text and "\n" not in text and text.startswith(f"setting '{item}'")


def test_none_and_text_where_the_field_takes_them():
    cfg = apply_settings(get_preset("3dgs"), ["density.max_gaussians=5000", "density.max_gaussians=None",
                                              "batch_lr_rule=grendel"])
    assert cfg.density.max_gaussians is None and cfg.batch_lr_rule == "grendel"


def test_the_scene_form():
    assert parse_scene_spec("demo=scenes/demo") == SceneSpec(Path("scenes/demo"), "demo")
    spec = parse_scene_spec("tc=/data/test_colmap:r=8:w:density.max_gaussians=3000:init_random_points=400")
    assert (spec.label, spec.path, spec.resolution, spec.white_background) == ("tc", Path("/data/test_colmap"), 8, True)
    assert spec.settings == ("density.max_gaussians=3000", "init_random_points=400")
    assert spec.train_flags() == ["-r", "8", "-w"]
    assert parse_scene_spec(str(spec)) == spec  # it writes itself back in the same form
    bare = parse_scene_spec("/data/run=3/fox:r=400")  # no NAME: the '=' belongs to the path
    assert (bare.name, bare.label, bare.path, bare.resolution) == ("", "fox", Path("/data/run=3/fox"), 400)
    with pytest.raises(InputError, match="takes no settings"):
        without_settings(spec, "a tool")


@pytest.mark.parametrize("text, message", [
    ("demo=scenes/demo:r8", "unknown option ':r8'"),  # the old spelling
    ("demo=scenes/demo:cap=6000", None),  # well-formed; the field is checked where it is applied
    ("demo=:r=2", "no path"),
    ("demo=scenes/demo:r=x", "r=x is not a downscale factor"),
    ("demo=scenes/demo:white", "unknown option ':white'"),
])
def test_a_bad_scene_is_one_line(text, message):
    if message is None:
        assert parse_scene_spec(text).settings == ("cap=6000",)
        with pytest.raises(InputError, match="has no field 'cap'"):
            apply_settings(get_preset("turbo"), parse_scene_spec(text).settings)
        return
    with pytest.raises(InputError) as raised:
        parse_scene_spec(text)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_a_scene_loads_as_it_says():
    scene = parse_scene_spec(f"demo={DEMO}:r=2").load(eval_split=True, log=lambda message: None)
    assert (scene.train[0].width, scene.train[0].height) == (64, 48)


def test_gaussian_counts_keep_the_start_every_change_and_the_peak():
    counts = GaussianCounts(100)
    steps = [  # what a strategy reports each step, as the trainer hands it to its observer
        {"densified": False, "n_cloned": 0, "n_gaussians": 100},
        {"densified": True, "n_cloned": 30, "n_split": 10, "n_pruned": 5, "n_gaussians": 145, "budget": 200},
        {"densified": False, "n_cloned": 0, "n_gaussians": 145},
        {"densified": False, "n_pruned": 45, "n_gaussians": 100},  # a cut without densifying
        {"densified": True, "n_cloned": 0, "n_relocated": 7, "n_gaussians": 100},  # relocation: same count
    ]
    for step, stats in enumerate(steps, start=1):
        counts.density(stats)
        counts.after_step(step, step * 0.5)
    counts.after_step(6, 3.0)  # a step with no report records nothing
    assert counts.peak == 145
    assert counts.events == [
        {"step": 0, "seconds": 0.0, "num_gaussians": 100},
        {"step": 2, "seconds": 1.0, "num_gaussians": 145, "n_cloned": 30, "n_split": 10, "n_pruned": 5},
        {"step": 4, "seconds": 2.0, "num_gaussians": 100, "n_pruned": 45},
        {"step": 5, "seconds": 2.5, "num_gaussians": 100, "n_cloned": 0, "n_relocated": 7},
    ]


def test_a_trainer_placed_inside_a_run_starts_from_exactly_n_ray_points(tmp_path):
    from turbogs.bench.step_trainer import RUN_STEPS, trainer_at, without_points
    from turbogs.data.load import load_scene

    scene = without_points(load_scene(DEMO, resolution=2, eval_split=True, log=lambda message: None))
    trainer = trainer_at(scene, get_preset("3dgs"), 700, 0.7, tmp_path)
    assert len(trainer.gaussians) == 700 and trainer.step == int(0.7 * RUN_STEPS) and trainer.cfg.steps == RUN_STEPS
    trainer.timed_step()
    assert trainer.step == int(0.7 * RUN_STEPS) + 1
