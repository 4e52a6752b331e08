"""3DGS-MCMC density control (turbogs/density/mcmc.py) against independent computations:
the relocation correction against a quadrature of the composited profile, the cap against
counting, the optimizers' per-row state against row ids, and a fixed-seed run twice."""

from __future__ import annotations

import math

import pytest
import torch
from test_cli import small_demo
from test_density import make_gaussians

from turbogs.cli import main
from turbogs.density.base import DensityStep
from turbogs.density.mcmc import MAX_COPIES, McmcDensity, McmcDensityConfig, relocation_values
from turbogs.errors import InputError
from turbogs.formats.ply import read_ply
from turbogs.gaussians import PARAM_NAMES
from turbogs.optim.base import AdamConfig
from turbogs.optim.hybrid import HybridConfig
from turbogs.training.config import get_preset


def ids(gaussians):
    return gaussians.params["sh0"].detach()[:, 0, 0].round().long().tolist()


def profile_integral(opacity: float, n: int, sigma: float) -> float:
    """The integral over a ray through the centre of n identical 1D Gaussians of peak
    `opacity` and width `sigma` composited: 1 - (1 - o exp(-x^2 / 2 sigma^2))^n, by the
    trapezoid rule on a fine grid (float64)."""
    x = torch.linspace(-12 * sigma, 12 * sigma, 200_001, dtype=torch.float64)
    y = 1 - (1 - opacity * torch.exp(-0.5 * (x / sigma) ** 2)) ** n
    return float(torch.trapezoid(y, x))


@pytest.mark.parametrize("opacity", [0.01, 0.3, 0.9, 0.995])
def test_relocation_values_keep_the_composited_profile(opacity):
    copies = torch.tensor([1, 2, 3, 7, 20, MAX_COPIES])
    new_opacity, factor = relocation_values(torch.full((len(copies),), opacity, dtype=torch.float64), copies)
    for n, o_new, c in zip(copies.tolist(), new_opacity.tolist(), factor.tolist()):
        assert 1 - (1 - o_new) ** n == pytest.approx(opacity, rel=1e-9)  # at the centre: the same opacity
        # along the ray: the same integral as the one Gaussian had (o x sqrt(2 pi) x 1)
        assert profile_integral(o_new, n, c) == pytest.approx(opacity * math.sqrt(2 * math.pi), rel=1e-6)
    assert new_opacity[0] == pytest.approx(opacity) and factor[0] == pytest.approx(1.0)  # one copy: unchanged


def make_optimizers(gaussians, kind):
    rates = {name: 0.0 if name == "sh0" else 0.01 for name in PARAM_NAMES}  # sh0's ids stay exact
    config = AdamConfig() if kind == "adam" else HybridConfig()
    return config, config.build({name: gaussians.params[name] for name in PARAM_NAMES}, rates)


def take_steps(gaussians, config, optimizers, steps=3, seed=1):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for param in gaussians.params.values():
            param.grad = torch.randn(param.shape, generator=gen)
        curvature = {"means": torch.rand(len(gaussians), 3, generator=gen)} if isinstance(config, HybridConfig) else None
        config.step(optimizers, torch.ones(len(gaussians), dtype=torch.bool), curvature)


def row_states(gaussians, optimizers):
    """Per parameter, the per-row optimizer tensors (name -> [N, ...])."""
    out = {}
    for name, optimizer in optimizers.items():
        param = gaussians.params[name]
        for key, value in optimizer.state[param].items():
            if torch.is_tensor(value) and value.dim() >= 1 and value.shape[0] == len(gaussians):
                out[(name, key)] = value.clone()
    return out


def refine_step(strategy, gaussians, optimizers, step=100, progress=0.5):
    return strategy.control({}, DensityStep(step, progress, gaussians, optimizers))


@pytest.mark.parametrize("kind", ["adam", "hybrid"])
def test_relocation_keeps_every_optimizers_rows_consistent(kind):
    torch.manual_seed(0)
    n = 60
    opacities = torch.rand(n, generator=torch.Generator().manual_seed(3)) * 0.9 + 0.05
    opacities[::6] = 0.001  # ten dead ones
    gaussians = make_gaussians(n, opacities=opacities)
    config, optimizers = make_optimizers(gaussians, kind)
    take_steps(gaussians, config, optimizers)
    before_state = row_states(gaussians, optimizers)
    assert before_state  # the optimizer keeps per-row state, and it is not all zero
    before = {name: gaussians.params[name].detach().clone() for name in PARAM_NAMES}
    strategy = McmcDensity(McmcDensityConfig(max_gaussians=66, noise_lr=0.0))
    stats = refine_step(strategy, gaussians, optimizers)

    assert stats["n_relocated"] == 10 and stats["n_cloned"] == 3 and len(gaussians) == 63
    after_ids = ids(gaussians)
    dead = set(range(0, n, 6))
    copies = {i: after_ids.count(i) for i in set(after_ids)}
    assert not dead & set(after_ids)  # every dead Gaussian is gone (moved)
    assert sum(c - 1 for c in copies.values()) == 13  # 10 relocated + 3 grown, all copies of live ones
    after_state = row_states(gaussians, optimizers)
    assert after_state.keys() == before_state.keys()
    for name, optimizer in optimizers.items():  # every optimizer holds the new parameter
        assert optimizer.param_groups[0]["params"][0] is gaussians.params[name]
    for row, i in enumerate(after_ids):
        if copies[i] == 1:  # untouched: values and optimizer state exactly as before
            for name in PARAM_NAMES:
                assert torch.equal(gaussians.params[name].detach()[row], before[name][i])
            for key, value in after_state.items():
                assert torch.equal(value[row], before_state[key][i]), key
        else:  # a source or its copy: corrected values, a fresh start
            for key, value in after_state.items():
                assert torch.all(value[row] == 0), key
            o_old = torch.sigmoid(before["opacities"][i : i + 1].double())
            o_new, factor = relocation_values(o_old, torch.tensor([copies[i]]))
            assert float(gaussians.opacities.detach()[row]) == pytest.approx(float(o_new), rel=1e-4)
            torch.testing.assert_close(gaussians.params["scales"].detach()[row].double(),
                                       before["scales"][i].double() + math.log(float(factor)), atol=1e-5, rtol=0)
            assert torch.equal(gaussians.params["means"].detach()[row], before["means"][i])


def test_the_count_grows_to_exactly_the_cap_and_never_past_it():
    torch.manual_seed(1)
    gaussians = make_gaussians(100)
    _, optimizers = make_optimizers(gaussians, "adam")
    strategy = McmcDensity(McmcDensityConfig(max_gaussians=137, grow_rate=0.05, noise_lr=0.0))
    counts = []
    for step in range(1, 2001):
        strategy.control({}, DensityStep(step, step / 2000 * 0.8, gaussians, optimizers))
        counts.append(len(gaussians))
        if step % 100 == 50:
            with torch.no_grad():  # some Gaussians die between refinements
                gaussians.params["opacities"][torch.randint(len(gaussians), (3,))] = -10.0
    assert max(counts) == 137 and counts[-1] == 137
    assert counts == sorted(counts)  # never shrinks
    # 5 % a refinement (int(100 x 1.05), int(105 x 1.05), ...), the last step cut at the cap
    assert sorted(set(counts)) == [100, 105, 110, 115, 120, 126, 132, 137]


def test_a_start_above_the_cap_is_cut_to_the_most_opaque():
    opacities = torch.linspace(0.1, 0.9, 50)
    gaussians = make_gaussians(50, opacities=opacities)
    _, optimizers = make_optimizers(gaussians, "adam")
    McmcDensity(McmcDensityConfig(max_gaussians=20)).control({}, DensityStep(1, 0.0, gaussians, optimizers))
    assert ids(gaussians) == list(range(30, 50))


def test_noise_moves_transparent_gaussians_only_and_nothing_on_a_bad_step():
    opacities = torch.tensor([0.001, 0.002, 0.5, 0.99])
    gaussians = make_gaussians(4, opacities=opacities)
    _, optimizers = make_optimizers(gaussians, "adam")
    strategy = McmcDensity(McmcDensityConfig())
    start = gaussians.means.detach().clone()
    strategy.control({}, DensityStep(1, 0.9, gaussians, optimizers, ok=torch.tensor(False)))
    assert torch.equal(gaussians.means.detach(), start)
    strategy.control({}, DensityStep(1, 0.9, gaussians, optimizers, ok=torch.tensor(True)))
    moved = (gaussians.means.detach() - start).norm(dim=-1)
    assert float(moved[0]) > 0 and float(moved[1]) > 0
    assert float(moved[2]) < 1e-12 * float(moved[0]) + 1e-30 and float(moved[3]) == 0.0


def test_regularizer_is_the_mean_opacity_and_scale():
    gaussians = make_gaussians(10)
    strategy = McmcDensity(McmcDensityConfig(opacity_reg=0.3, scale_reg=0.7))
    want = 0.3 * torch.sigmoid(gaussians.params["opacities"]).mean() + 0.7 * torch.exp(gaussians.params["scales"]).mean()
    torch.testing.assert_close(strategy.regularizer(gaussians), want)
    assert McmcDensity(McmcDensityConfig(opacity_reg=0, scale_reg=0)).regularizer(gaussians) is None


def test_settings_are_checked_and_the_bench_ablations_exist():
    with pytest.raises(InputError):
        McmcDensityConfig(refine_from=0.9, refine_until=0.5)
    with pytest.raises(InputError):
        McmcDensityConfig(max_gaussians=0)
    for preset in ("turbo+density-mcmc", "3dgs+density-mcmc"):
        assert isinstance(get_preset(preset).density, McmcDensityConfig)


def test_fixed_seed_runs_are_identical_and_stay_under_the_cap(tmp_path):
    """turbo's sampler and the hybrid optimizer with MCMC, twice in one process: the same bits."""
    scene = small_demo(tmp_path, views=8)
    models = []
    for run in ("a", "b"):
        out = tmp_path / run
        assert main(["train", str(scene), "--out", str(out), "--steps", "120", "--quiet", "--seed", "4",
                     "--density", "mcmc", "--max-gaussians", "3100", "--optimizer", "hybrid"]) == 0
        models.append(read_ply(next(out.glob("point_cloud/iteration_*/point_cloud.ply")))[0])
    assert len(models[0]["means"]) == 3100  # the demo's 3000 points grew to the cap, not past it
    for name in models[0]:
        assert (models[0][name] == models[1][name]).all(), name
