"""All optimizers stepped at once (turbogs/optim/hybrid_step.py) equal each HybridOptimizer
stepped alone, bit for bit, on random problems, and take far fewer ops. (That the step is the
documented rule is tests/test_optim.py's reference run.)"""

import pytest
import torch

from turbogs.bench.audit import OpCounter
from turbogs.optim.hybrid import HybridConfig, HybridOptimizer
from turbogs.optim.hybrid_step import foreach_step

SHAPES = {"means": (3,), "scales": (3,), "quats": (4,), "opacities": (), "sh0": (1, 3), "shN": (15, 3)}


def make(seed, rows=64, config=None):
    gen = torch.Generator().manual_seed(seed)
    params = {name: torch.nn.Parameter(torch.randn((rows,) + shape, generator=gen)) for name, shape in SHAPES.items()}
    rates = {name: 10 ** (-1 - 3 * float(torch.rand(1, generator=gen))) for name in SHAPES}
    config = config or HybridConfig(curvature_on=("means", "scales"))
    # A HybridOptimizer for every parameter (config.build gives the uncurved ones fused Adam):
    # the foreach step over all six is what is tested.
    optimizers = {name: HybridOptimizer([param], **config.optimizer_kwargs(rates[name], name in config.curvature_on))
                  for name, param in params.items()}
    return config, params, optimizers, gen


def run(seed, path, oks, config=None, frozen=()):
    """Train a random problem for len(oks) steps; path 'single' steps each optimizer alone."""
    config, params, optimizers, gen = make(seed, config=config)
    for i, ok in enumerate(oks):
        for name, param in params.items():
            bad = ok is False and name == "quats"
            param.grad = None if name in frozen else (
                torch.full_like(param, float("nan")) if bad else torch.randn(param.shape, generator=gen))
        flag = None if ok is None else torch.tensor(ok)
        if path == "single":
            for optimizer in optimizers.values():
                optimizer.step(ok=flag)
        else:
            foreach_step(list(optimizers.values()), None, flag)
        if i % 2 == 1:  # curvature estimates every other step, as every 10th in training
            for name in config.curvature_on:
                optimizers[name].update_hessian(torch.rand(params[name].shape, generator=gen) ** 2,
                                                visible=torch.rand(64, generator=gen) > 0.3, ok=flag)
    return params, optimizers


def assert_identical(a, b):
    (params_a, optimizers_a), (params_b, optimizers_b) = a, b
    for name in params_a:
        assert torch.equal(params_a[name], params_b[name]), name
        state_a = optimizers_a[name].state.get(params_a[name], {})
        state_b = optimizers_b[name].state.get(params_b[name], {})
        assert state_a.keys() == state_b.keys()
        for key in state_a:
            assert torch.equal(state_a[key], state_b[key]), (name, key)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("oks", [[None] * 7, [True, True, False, True, False, True, True]])
def test_foreach_step_equals_each_optimizer_alone(seed, oks):
    assert_identical(run(seed, "single", oks), run(seed, "foreach", oks))


def test_foreach_step_with_uncalibrated_curvature_and_a_frozen_parameter():
    config = HybridConfig(curvature_on=("means",), calibration_quantile=None, max_lengthening=1.0)
    oks = [True, False, True, True]
    assert_identical(run(5, "single", oks, config, frozen=("sh0",)), run(5, "foreach", oks, config, frozen=("sh0",)))


def test_foreach_step_with_a_clip_and_per_row_bias_correction():
    """The options that work row by row give the same bits at once as alone."""
    config = HybridConfig(clip=0.5, row_bias_correction=True)
    assert_identical(run(6, "single", [True, True, True], config), run(6, "foreach", [True, True, True], config))


def test_foreach_step_takes_few_ops_and_no_read():
    config, params, optimizers, gen = make(0)
    single_config, single_params, single_optimizers, _ = make(0)
    for name, param in params.items():
        param.grad = torch.randn(param.shape, generator=gen)
        single_params[name].grad = param.grad.clone()
    counter = OpCounter()
    with counter, counter.in_section("step"):
        foreach_step(list(optimizers.values()), None, torch.tensor(True))
    single = OpCounter()
    with single, single.in_section("step"):
        for optimizer in single_optimizers.values():
            optimizer.step(ok=torch.tensor(True))
    assert not counter.reads
    assert counter.ops < single.ops / 2, (counter.ops, single.ops)
    # The config's step (fused Adam for the uncurved parameters, the hybrid for the rest) reads nothing either.
    built = config.build(params, {name: 1e-3 for name in params})
    for name, param in params.items():
        param.grad = torch.randn(param.shape, generator=gen)
    mixed = OpCounter()
    with mixed, mixed.in_section("step"):
        config.step(built, None, None, torch.tensor(True))
    assert not mixed.reads
    assert mixed.ops < counter.ops, (mixed.ops, counter.ops)


# --- the 3dgs preset's fused Adam, all optimizers in one pass -----------------------------


@pytest.mark.parametrize("oks", [[None] * 4, [True, False, True, True]])
def test_fused_adam_all_at_once_equals_each_optimizer_step(oks):
    from turbogs.optim.base import AdamConfig

    def train(at_once):
        gen = torch.Generator().manual_seed(3)
        params = {name: torch.nn.Parameter(torch.randn((32,) + shape, generator=gen)) for name, shape in SHAPES.items()}
        config = AdamConfig()
        optimizers = config.build(params, {name: 0.001 * (i + 1) for i, name in enumerate(SHAPES)})
        ops = []
        for ok in oks:
            for name, param in params.items():
                param.grad = torch.randn(param.shape, generator=gen)
                if ok is False and name == "means":
                    param.grad[0, 0] = float("inf")
            flag = None if ok is None else torch.tensor(ok)
            counter = OpCounter()
            with counter, counter.in_section("step"):
                if at_once:
                    config.step(optimizers, None, None, flag)
                else:  # each optimizer's own step(), as torch runs it
                    for optimizer in optimizers.values():
                        optimizer.found_inf = None if flag is None else (~flag).to(torch.float32)
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
            assert not counter.reads
            ops.append(counter.ops)
        return params, optimizers, ops

    at_once, each = train(True), train(False)
    assert_identical(at_once[:2], each[:2])
    assert at_once[2][-1] < each[2][-1] / 2, (at_once[2], each[2])
