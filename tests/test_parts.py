"""A run records which of the method's parts trained it (TrainConfig.parts): in results.json and
cfg_args, so that a model, or a comparison of two, says what ran. Each ablation changes its part,
and only its part."""

from __future__ import annotations

import json

import pytest
from test_cli import small_demo

from turbogs.cli import main
from turbogs.formats.model_folder import read_cfg_args
from turbogs.training.config import get_preset

TURBO = {"sampler": "error-guided-tiles", "loss": "l1+dssim+ncc", "density": "error", "optimizer": "hybrid",
         "coarse_to_fine": True}


def test_the_presets_name_their_parts():
    assert get_preset("turbo").parts() == TURBO
    assert get_preset("3dgs").parts() == {"sampler": "every-tile", "loss": "l1+dssim", "density": "3dgs",
                                          "optimizer": "adam", "coarse_to_fine": False}


@pytest.mark.parametrize("ablation, part, value", [
    ("no-sparse", "sampler", "error-guided-views"),
    ("no-ncc", "loss", "l1+dssim"),
    ("density-3dgs", "density", "3dgs"),
    ("density-mcmc", "density", "mcmc"),
    ("optimizer-adam", "optimizer", "adam"),
    ("no-coarse-to-fine", "coarse_to_fine", False),
])
def test_each_ablation_changes_its_part_only(ablation, part, value):
    assert get_preset(f"turbo+{ablation}").parts() == {**TURBO, part: value}


def test_the_model_records_the_parts_it_trained_with(tmp_path):
    scene = small_demo(tmp_path, views=8)
    out = tmp_path / "model"
    assert main(["train", str(scene), "--out", str(out), "--steps", "12", "--eval", "--quiet",
                 "--no-ncc", "--optimizer", "adam", "--density", "mcmc"]) == 0
    expected = {**TURBO, "loss": "l1+dssim", "optimizer": "adam", "density": "mcmc"}
    assert json.loads((out / "results.json").read_text())["parts"] == expected
    saved = read_cfg_args(out / "cfg_args")
    assert {key: saved[key] for key in expected} == expected
    assert saved["sh_degree"] == 3 and saved["antialiased"] is False  # INRIA's fields stay as they were
