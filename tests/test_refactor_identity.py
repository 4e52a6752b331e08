"""A refactor changes no result: both presets, a fixed seed, the same numbers as before it.

The figures below were measured at commit ba939dd (before the layering of issue 18) with
exactly the command in `train_demo`, on x86-64 CPU with torch 2.13 and one thread. Each run
is long enough to densify (3dgs at step 200, turbo at steps 100 and 200) and to switch
the turbo preset to sparse tiles and the hybrid optimizer's curvature steps, so that every
part of the step is covered. Any change to the arithmetic of a step, its order, or the
random stream moves the checksums; a pure move of code does not.
"""

import json

import numpy as np
import pytest
import torch
from plyfile import PlyData

from test_cli import DEMO
from turbogs.cli import main

# preset: (steps, Gaussians, sum of every PLY value, sum of their magnitudes, test PSNR, test SSIM)
BEFORE = {
    "turbo": (300, 3629, -23721.225125036042, 54410.62729067676, 18.164848197344213, 0.6482608616352081),
    "3dgs": (500, 5539, -41273.047854563825, 93500.30203461373, 22.951946583793333, 0.8181173205375671),
}

# Issue 15 made the 3dgs preset's Adam torch's fused kernel (one op per parameter, no host read of
# its step counter, skipping a non-finite step on the device). The kernel rounds the last float32
# bit differently from the foreach Adam that measured the figures (about 1e-7 relative per step on
# a toy problem), so for 3dgs the figures must agree within float tolerance, not bit for bit:
# the same Gaussian count (every density decision unchanged), checksums within 1e-5 relative,
# PSNR within 0.01 dB and SSIM within 1e-3. Turbo's hybrid optimizer still matches exactly.
# Later in issue 15 the 3dgs loss's SSIM blurred its five moments in one convolution: the same
# forward bits (tests/test_read_free_steps.py), but autograd adds the gradient paths into the
# image in another order, and after 500 steps the signed sum moved from 2.1e-6 to 1.9e-5
# relative (the sum of magnitudes 3e-6, PSNR 6e-4 dB, SSIM 3e-5; measured): the signed sum,
# where the values cancel, is allowed 5e-5.
ROUNDED_BY_FUSED_ADAM = {"3dgs"}


def train_demo(preset: str, steps: int, out) -> tuple:
    code = main(["train", str(DEMO), "--preset", preset, "--eval", "--steps", str(steps), "--seed", "0",
                 "--out", str(out), "--quiet"])
    assert code == 0
    ply = sorted(out.glob("point_cloud/iteration_*/point_cloud.ply"))[-1]
    vertex = PlyData.read(str(ply))["vertex"].data
    values = np.stack([vertex[name].astype(np.float64) for name in vertex.dtype.names], axis=1)
    results = json.loads((out / "results.json").read_text())
    return len(vertex), float(values.sum()), float(np.abs(values).sum()), results["psnr"], results["ssim"]


@pytest.mark.slow
@pytest.mark.skipif(not torch.__version__.startswith("2.13."), reason="figures measured with torch 2.13 on CPU")
@pytest.mark.parametrize("preset", sorted(BEFORE))
def test_fixed_seed_run_matches_the_pre_refactor_figures(preset, tmp_path):
    steps, *expected = BEFORE[preset]
    got = train_demo(preset, steps, tmp_path / preset)
    if preset not in ROUNDED_BY_FUSED_ADAM:
        assert got == tuple(expected)
        return
    count, total, magnitude, psnr, ssim = got
    assert count == expected[0]  # every density decision the same
    assert total == pytest.approx(expected[1], rel=5e-5) and magnitude == pytest.approx(expected[2], rel=1e-5)
    assert psnr == pytest.approx(expected[3], abs=0.01) and ssim == pytest.approx(expected[4], abs=1e-3)
