"""Row operations keep optimizer and extra state aligned; the vanilla 3DGS schedule
selects, splits, prunes and resets what INRIA's rules say, checked against
hand-computed gradients and independent formulas."""

import math
from types import SimpleNamespace

import pytest
import torch
from density_helpers import MOMENTS, after_backward

from turbogs.density import VanillaDensity, VanillaDensityConfig, rows
from turbogs.errors import InputError
from turbogs.gaussians import PARAM_NAMES, Gaussians

# --- helpers ------------------------------------------------------------------------


def make_gaussians(n, seed=0, log_scales=None, opacities=None):
    """Random Gaussians whose sh0[:, 0, 0] holds the row's id, so rows can be tracked."""
    gen = torch.Generator().manual_seed(seed)
    params = {
        "means": torch.randn(n, 3, generator=gen),
        "scales": torch.randn(n, 3, generator=gen) * 0.3 - 2.0 if log_scales is None else log_scales,
        "quats": torch.randn(n, 4, generator=gen),
        "opacities": torch.randn(n, generator=gen) if opacities is None else torch.logit(opacities),
        "sh0": torch.randn(n, 1, 3, generator=gen),
        "shN": torch.randn(n, 3, 3, generator=gen),
    }
    params["sh0"][:, 0, 0] = torch.arange(n, dtype=torch.float32)
    return Gaussians(params, sh_degree=1)


def make_optimizers(gaussians):
    # sh0 gets lr 0: its moments still evolve, but the id tags stay exact.
    return {
        name: torch.optim.Adam([gaussians.params[name]], lr=0.0 if name == "sh0" else 0.01)
        for name in PARAM_NAMES
    }


def ids(gaussians):
    return gaussians.params["sh0"].detach()[:, 0, 0].round().long().tolist()


def adam_steps(gaussians, optimizers, steps, seed=1):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for name, param in gaussians.params.items():
            param.grad = torch.randn(param.shape, generator=gen)
        for opt in optimizers.values():
            opt.step()


def snapshot(gaussians, optimizers):
    """Detached copies of every parameter and moment, and the Adam step counts."""
    out = {}
    for name in PARAM_NAMES:
        param = gaussians.params[name]
        state = optimizers[name].state[param]
        out[name] = {"value": param.detach().clone(), "step": state["step"].clone()}
        out[name].update({m: state[m].clone() for m in MOMENTS})
    return out


def assert_bound(gaussians, optimizers):
    """Each optimizer holds exactly the current parameter and has state for it only."""
    for name in PARAM_NAMES:
        param = gaussians.params[name]
        group_params = optimizers[name].param_groups[0]["params"]
        assert len(group_params) == 1 and group_params[0] is param
        assert list(optimizers[name].state.keys()) in ([], [param])  # [] before the first step


def assert_rows(gaussians, optimizers, before, source, n_new):
    """Rows are before[source] followed by n_new rows with zero moments; step kept."""
    for name in PARAM_NAMES:
        param = gaussians.params[name]
        state = optimizers[name].state[param]
        assert param.shape[0] == len(source) + n_new
        assert torch.equal(param.detach()[: len(source)], before[name]["value"][source])
        for m in MOMENTS:
            assert state[m].shape == param.shape
            assert torch.equal(state[m][: len(source)], before[name][m][source])
            assert torch.all(state[m][len(source):] == 0)
        assert torch.equal(state["step"], before[name]["step"])


def rotate(quats, vectors):
    """Rotate vectors by unit quaternions (w, x, y, z) with v' = v + 2w(u x v) + 2u x (u x v),
    a formula independent of the rotation-matrix code under test."""
    q = torch.nn.functional.normalize(quats, dim=-1)
    w, u = q[:, :1], q[:, 1:]
    uv = torch.cross(u, vectors, dim=-1)
    return vectors + 2 * w * uv + 2 * torch.cross(u, uv, dim=-1)


def fake_render(pixel_grads, visible, radii=None):
    """A stand-in for RenderOutput whose means2d gradient (in pixels) is set by hand."""
    means2d = torch.zeros(pixel_grads.shape, requires_grad=True)
    means2d.grad = pixel_grads.clone()
    if radii is None:
        radii = visible.long() * 3
    return SimpleNamespace(means2d=means2d, visible=visible, radii=radii)


# --- row operations -----------------------------------------------------------------


def test_remove_rows_keeps_state_of_kept_rows():
    g = make_gaussians(7)
    opts = make_optimizers(g)
    adam_steps(g, opts, 3)
    before = snapshot(g, opts)
    keep = torch.tensor([True, False, True, True, False, False, True])
    extra = {"id": torch.arange(7.0), "curvature": torch.arange(21.0).reshape(7, 3)}

    extra = rows.remove_rows(g, opts, keep, extra=extra)

    source = torch.tensor([0, 2, 3, 6])
    assert_rows(g, opts, before, source, n_new=0)
    assert_bound(g, opts)
    assert ids(g) == [0, 2, 3, 6]
    assert extra["id"].tolist() == [0, 2, 3, 6]
    assert torch.equal(extra["curvature"], torch.arange(21.0).reshape(7, 3)[source])


def test_duplicate_copies_rows_with_zero_moments_and_carries_grads():
    g = make_gaussians(5)
    opts = make_optimizers(g)
    adam_steps(g, opts, 2)
    before = snapshot(g, opts)
    grads = {name: g.params[name].grad.clone() for name in PARAM_NAMES}
    mask = torch.tensor([False, True, False, True, True])

    extra = rows.duplicate(g, opts, mask, extra={"id": torch.arange(5.0) + 1})

    assert_rows(g, opts, before, torch.arange(5), n_new=3)
    assert_bound(g, opts)
    assert ids(g) == [0, 1, 2, 3, 4, 1, 3, 4]
    for name in PARAM_NAMES:  # the copies are exact copies
        assert torch.equal(g.params[name].detach()[5:], before[name]["value"][mask])
        assert torch.equal(g.params[name].grad[:5], grads[name])
        assert torch.all(g.params[name].grad[5:] == 0)
    assert extra["id"].tolist() == [1, 2, 3, 4, 5, 0, 0, 0]


def test_append_rows_adds_given_values_with_zero_moments():
    g = make_gaussians(4)
    opts = make_optimizers(g)
    adam_steps(g, opts, 2)
    before = snapshot(g, opts)
    new = make_gaussians(2, seed=5).raw()

    extra = rows.append_rows(g, opts, new, extra={"count": torch.ones(4)})

    assert_rows(g, opts, before, torch.arange(4), n_new=2)
    assert_bound(g, opts)
    for name in PARAM_NAMES:
        assert torch.equal(g.params[name].detach()[4:], new[name])
    assert extra["count"].tolist() == [1, 1, 1, 1, 0, 0]


def test_split_children_scales_copies_and_state():
    g = make_gaussians(6)
    opts = make_optimizers(g)
    adam_steps(g, opts, 2)
    before = snapshot(g, opts)
    mask = torch.tensor([True, False, False, True, False, True])

    extra = rows.split(g, opts, mask, n=2, extra={"id": torch.arange(6.0)}, generator=torch.Generator().manual_seed(0))

    assert_rows(g, opts, before, torch.tensor([1, 2, 4]), n_new=6)
    assert_bound(g, opts)
    assert ids(g) == [1, 2, 4, 0, 3, 5, 0, 3, 5]
    parents = torch.tensor([0, 3, 5, 0, 3, 5])
    children = g.params
    assert torch.allclose(torch.exp(children["scales"].detach()[3:]), torch.exp(before["scales"]["value"][parents]) / 1.6)
    for name in ("quats", "opacities", "sh0", "shN"):
        assert torch.equal(children[name].detach()[3:], before[name]["value"][parents])
    assert not torch.equal(children["means"].detach()[3:], before["means"]["value"][parents])
    assert extra["id"].tolist() == [1, 2, 4, 0, 0, 0, 0, 0, 0]


def test_split_samples_follow_the_parent_distribution():
    """Whitened offsets R^T (x - mean) / scale of the children must be standard normal:
    ~97.1% inside the 3-sigma ellipsoid (chi-square, 3 dof), none far outside."""
    n_children = 600
    log_scales = torch.log(torch.tensor([[0.5, 0.05, 0.2], [0.01, 0.3, 0.1], [1.0, 1.0, 0.02]]))
    g = make_gaussians(3, seed=3, log_scales=log_scales)
    parents = g.raw()
    rows.split(g, {}, torch.ones(3, dtype=torch.bool), n=n_children, generator=torch.Generator().manual_seed(1))

    idx = torch.arange(3).repeat(n_children)  # children are ordered like .repeat
    offsets = g.means.detach() - parents["means"][idx]
    conjugate = parents["quats"][idx] * torch.tensor([1.0, -1.0, -1.0, -1.0])
    whitened = rotate(conjugate, offsets) / torch.exp(parents["scales"][idx])

    radius2 = (whitened ** 2).sum(dim=1)
    assert 0.95 <= (radius2 <= 9.0).float().mean() <= 0.99
    assert radius2.max() < 36.0
    assert whitened.mean(dim=0).abs().max() < 0.1
    covariance = whitened.T @ whitened / len(whitened)
    assert torch.allclose(covariance, torch.eye(3), atol=0.12)
    assert torch.allclose(g.scales, torch.exp(parents["scales"][idx]) / (0.8 * n_children), rtol=1e-5)


def test_adam_after_row_ops_matches_adam_that_never_saw_the_other_rows():
    """Adam is elementwise, so kept rows must evolve exactly as in an optimizer that only
    ever held those rows, including the step taken with the gradient carried through."""
    g_full, g_kept = make_gaussians(6), make_gaussians(6)
    keep = torch.tensor([True, True, False, True, False, True])
    rows.remove_rows(g_kept, {}, keep)
    opts_full, opts_kept = make_optimizers(g_full), make_optimizers(g_kept)

    gen = torch.Generator().manual_seed(7)
    for step in range(6):
        for name in PARAM_NAMES:
            grad = torch.randn((6,) + g_kept.params[name].shape[1:], generator=gen)
            g_kept.params[name].grad = grad[keep].clone()
            if step <= 2:  # g_full still holds all 6 rows
                full_grad = grad
            else:  # the 4 kept rows, then the copies (if any) with some gradient of their own
                full_grad = torch.cat([grad[keep], torch.ones_like(grad[: len(g_full) - 4])])
            g_full.params[name].grad = full_grad.clone()
        if step == 2:  # remove before stepping: the carried gradient must be used
            rows.remove_rows(g_full, opts_full, keep)
        if step == 4:  # duplicate: the original rows must not notice
            rows.duplicate(g_full, opts_full, torch.tensor([True, False, False, True]))
        for opt in list(opts_full.values()) + list(opts_kept.values()):
            opt.step()

    for name in PARAM_NAMES:
        assert torch.allclose(g_full.params[name].detach()[:4], g_kept.params[name].detach(), atol=1e-7, rtol=0)


def test_row_op_rejects_stale_optimizer_and_misaligned_extra():
    g = make_gaussians(4)
    opts = make_optimizers(g)
    g.replace(g.raw())  # a row change that bypassed rows: the optimizers are now stale
    with pytest.raises(RuntimeError, match="stale"):
        rows.remove_rows(g, opts, torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="extra state 'acc'"):
        rows.remove_rows(g, {}, torch.ones(4, dtype=torch.bool), extra={"acc": torch.zeros(3)})


# --- the vanilla strategy -----------------------------------------------------------


SCHEDULE_FOR_TESTS = dict(densify_from=1, densify_until=1000, densify_every=2, opacity_reset_every=500)


def test_accumulates_ndc_gradient_norms_of_visible_gaussians():
    strategy = VanillaDensity(VanillaDensityConfig(densify_from=100))
    g = make_gaussians(5)
    state = strategy.initial_state(5)
    width, height = 64, 32
    gen = torch.Generator().manual_seed(2)
    expected = {"grad2d": [0.0] * 5, "count": [0.0] * 5, "max_radii2d": [0.0] * 5}
    for step in range(1, 5):
        grads = torch.randn(5, 2, generator=gen) * 1e-4
        visible = torch.rand(5, generator=gen) > 0.4
        radii = torch.randint(1, 40, (5,), generator=gen) * visible
        after_backward(strategy, state, step, g, {}, fake_render(grads, visible, radii), width, height, 1.0)
        for i in range(5):  # brute force, one Gaussian at a time
            if visible[i]:
                gx, gy = grads[i, 0].item() * width / 2, grads[i, 1].item() * height / 2
                expected["grad2d"][i] += math.hypot(gx, gy)
                expected["count"][i] += 1
                expected["max_radii2d"][i] = max(expected["max_radii2d"][i], float(radii[i]))
    for key, values in expected.items():
        assert torch.allclose(state[key], torch.tensor(values), rtol=1e-5, atol=0), key


def test_clone_and_split_selection_against_hand_computed_gradients():
    """extent 10 -> small means max scale <= 0.1. W=100, H=50 -> NDC grad = (gx*50, gy*25).
    Threshold 2e-4 on the mean over the views that saw the Gaussian."""
    small, large = math.log(0.05), math.log(0.5)
    log_scales = torch.tensor([small] * 3 + [large] * 3)[:, None].repeat(1, 3)
    g = make_gaussians(6, log_scales=log_scales, opacities=torch.full((6,), 0.5))
    opts = make_optimizers(g)
    strategy = VanillaDensity(VanillaDensityConfig(**SCHEDULE_FOR_TESTS))
    state = strategy.initial_state(6)
    view1 = torch.tensor([
        [5e-6, 0.0],  # 0 small: 2.5e-4 twice -> clone
        [0.0, 6e-6],  # 1 small: 1.5e-4 (it would pass if y were scaled by W/2) -> nothing
        [3e-6, 3e-6],  # 2 small: |(1.5e-4, 7.5e-5)| = 1.68e-4 -> nothing
        [0.0, 1e-5],  # 3 large: 2.5e-4, then unseen: mean over 1 view -> split
        [5e-6, 0.0],  # 4 large: 2.5e-4, then 0: mean 1.25e-4 -> nothing
        [0.0, -9e-6],  # 5 large: 2.25e-4 twice -> split
    ])
    view2 = view1.clone()
    view2[4] = 0.0
    visible2 = torch.tensor([True, True, True, False, True, True])
    hand_view1 = torch.tensor([2.5e-4, 1.5e-4, (1.5e-4 ** 2 + 7.5e-5 ** 2) ** 0.5, 2.5e-4, 2.5e-4, 2.25e-4])

    after_backward(strategy, state, 1, g, opts, fake_render(view1, torch.ones(6, dtype=torch.bool)), 100, 50, 10.0)
    assert torch.allclose(state["grad2d"], hand_view1, rtol=1e-5, atol=0)
    before = g.raw()
    stats = after_backward(strategy, state, 2, g, opts, fake_render(view2, visible2), 100, 50, 10.0)

    assert stats["densified"] and stats["n_cloned"] == 1 and stats["n_split"] == 2 and stats["n_pruned"] == 0
    # clone appended after the originals, then split parents 3 and 5 replaced by children at the end
    assert ids(g) == [0, 1, 2, 4, 0, 3, 5, 3, 5]
    assert torch.equal(g.params["means"].detach()[4], before["means"][0])
    assert torch.allclose(g.scales[5:], torch.full((4, 3), 0.5 / 1.6))
    assert len(state["grad2d"]) == 9 and all(torch.all(v == 0) for v in state.values())
    assert_bound(g, opts)
    adam_steps(g, opts, 1)  # the optimizers accept the new rows


def test_prunes_transparent_and_too_big_gaussians_only_after_first_reset():
    extent = 1.0
    opacities = torch.tensor([0.004, 0.006, 0.5, 0.5, 0.5])
    log_scales = torch.log(torch.tensor([0.05, 0.05, 0.05, 0.2, 0.05]))[:, None].repeat(1, 3)  # 3: > 0.1 * extent
    radii = torch.tensor([3, 3, 3, 3, 25])  # 4: > 20 pixels on screen
    no_grad = torch.zeros(5, 2)
    visible = torch.ones(5, dtype=torch.bool)
    schedule = dict(densify_from=1, densify_every=10, opacity_reset_every=20)
    for screen, kept_late in ((None, [1, 2, 4]), (20.0, [1, 2])):  # the default (INRIA's code), the paper's test
        strategy = VanillaDensity(VanillaDensityConfig(**schedule, max_screen_size=screen))
        g = make_gaussians(5, log_scales=log_scales, opacities=opacities)
        state = strategy.initial_state(5)
        stats = after_backward(strategy, state, 10, g, make_optimizers(g), fake_render(no_grad, visible, radii), 64, 64, extent)
        assert stats["n_pruned"] == 1 and ids(g) == [1, 2, 3, 4]  # before the first reset: opacity only

        g = make_gaussians(5, log_scales=log_scales, opacities=opacities)
        state = strategy.initial_state(5)
        stats = after_backward(strategy, state, 30, g, make_optimizers(g), fake_render(no_grad, visible, radii), 64, 64, extent)
        assert ids(g) == kept_late and stats["n_pruned"] == 5 - len(kept_late)


def test_opacity_reset_fires_on_schedule_and_caps_at_one_percent():
    """(gsplat 1.5.3 writes `step % every == 0 & step > 0`, which is never true.)"""
    strategy = VanillaDensity(VanillaDensityConfig(densify_from=10_000, densify_until=100, opacity_reset_every=30))
    opacities = torch.tensor([0.9, 0.5, 0.02, 0.005, 0.0099])
    g = make_gaussians(5, opacities=opacities)
    opts = make_optimizers(g)
    state = strategy.initial_state(5)
    visible = torch.ones(5, dtype=torch.bool)
    reset_steps = []
    for step in range(1, 121):
        adam_steps(g, opts, 1, seed=step)  # moments become non-zero between resets
        logits_before = g.params["opacities"].detach().clone()
        adam_step_count = opts["opacities"].state[g.params["opacities"]]["step"].item()
        stats = after_backward(strategy, state, step, g, opts, fake_render(torch.zeros(5, 2), visible), 32, 32, 1.0)
        if stats["opacity_reset"]:
            reset_steps.append(step)
            param = g.params["opacities"]
            assert torch.all(g.opacities <= 0.01)
            low = torch.sigmoid(logits_before) <= 0.01
            assert torch.equal(param.detach()[low], logits_before[low])  # already low: untouched
            assert all(torch.all(opts["opacities"].state[param][m] == 0) for m in MOMENTS)
            assert opts["opacities"].state[param]["step"].item() == adam_step_count
            assert torch.any(opts["means"].state[g.params["means"]]["exp_avg"] != 0)  # others untouched
    assert reset_steps == [30, 60, 90]  # and none at or after densify_until


def schedule_of(cfg, run_steps):
    """The steps at which a run of `run_steps` steps densifies and resets, with the progress the
    trainer passes (the fraction done before the step)."""
    strategy = VanillaDensity(cfg)
    g = make_gaussians(5, opacities=torch.full((5,), 0.5))
    opts, state, visible = make_optimizers(g), strategy.initial_state(5), torch.ones(5, dtype=torch.bool)
    densified, resets = [], []
    for step in range(1, run_steps + 1):
        stats = after_backward(strategy, state, step, g, opts, fake_render(torch.zeros(5, 2), visible), 32, 32,
                               10.0, progress=(step - 1) / run_steps)
        densified += [step] if stats["densified"] else []
        resets += [step] if stats["opacity_reset"] else []
    return densified, resets


def test_a_time_budget_run_follows_its_progress_through_inrias_schedule():
    """A budget run's step count is unknown beforehand, so its schedule is INRIA's 30k steps
    scaled by progress: over a run that makes 4000 steps, a reset every tenth and the window
    closed at half. Counted in raw steps, the first reset came at step 3000 and the window
    never closed (the budget run collapsed to 11-16 dB)."""
    by_progress = VanillaDensityConfig().scaled(30_000, by_progress=True)
    densified, resets = schedule_of(by_progress, 4000)
    assert resets == [401, 801, 1201, 1601]  # position 7.5 x (step - 1) passes 3000, 6000, ...
    assert densified == list(range(100, 2001, 100))  # the position passes 500 at step 68, 15000 after 2000
    densified, resets = schedule_of(VanillaDensityConfig().scaled(30_000), 4000)
    assert resets == [3000] and densified[-1] == 4000  # the step-counted schedule of a 30k-step run
    # A short budget run: a crossing every 100 steps, but resets no closer than 3 densifications.
    densified, resets = schedule_of(by_progress, 1000)
    assert resets == [301] and densified == list(range(100, 501, 100))

    from turbogs.training.config import get_preset
    for preset in ("3dgs", "turbo+density-3dgs"):
        assert get_preset(preset).for_run(None, 100.0).density.by_progress
        assert not get_preset(preset).for_run(500, None).density.by_progress


def test_max_gaussians_cap_grows_only_the_highest_gradients():
    log_scales = torch.log(torch.tensor([0.05] * 5 + [0.5] * 5))[:, None].repeat(1, 3)
    g = make_gaussians(10, log_scales=log_scales, opacities=torch.full((10,), 0.5))
    opts = make_optimizers(g)
    strategy = VanillaDensity(VanillaDensityConfig(**SCHEDULE_FOR_TESTS, max_gaussians=13))
    state = strategy.initial_state(10)
    pixel = torch.tensor([3, 9, 1, 7, 5, 8, 2, 10, 4, 6], dtype=torch.float32) * 1e-5  # all above threshold
    grads = torch.stack([pixel, torch.zeros(10)], dim=1)
    stats = after_backward(strategy, state, 2, g, opts, fake_render(grads, torch.ones(10, dtype=torch.bool)), 64, 64, 10.0)

    assert len(g) == 13
    grown = sorted(set(i for i in ids(g) if ids(g).count(i) == 2))
    assert grown == [1, 5, 7]  # the three largest gradients: 10e-5 (7), 9e-5 (1), 8e-5 (5)
    assert stats["n_cloned"] == 1 and stats["n_split"] == 2

    stats = after_backward(strategy, state, 4, g, opts, fake_render(torch.full((13, 2), 1e-4), torch.ones(13, dtype=torch.bool)), 64, 64, 10.0)
    assert len(g) == 13 and stats["n_cloned"] + stats["n_split"] == 0  # at the cap: no growth


def test_strategy_state_must_follow_the_rows():
    strategy = VanillaDensity()
    g = make_gaussians(4)
    state = strategy.initial_state(4)
    rows.remove_rows(g, {}, torch.tensor([True, True, False, True]))  # state not passed as extra
    with pytest.raises(RuntimeError, match="turbogs.density.rows"):
        after_backward(strategy, state, 1, g, {}, fake_render(torch.zeros(3, 2), torch.ones(3, dtype=torch.bool)), 8, 8, 1.0)


def test_before_backward_keeps_the_means2d_gradient():
    means = torch.randn(3, 3, requires_grad=True)
    out = SimpleNamespace(means2d=means[:, :2] * 2.0)
    VanillaDensity().before_backward({}, out)
    out.means2d.sum().backward()
    assert torch.equal(out.means2d.grad, torch.ones(3, 2))


@pytest.mark.parametrize("total", [2000, 7000, 15_000])
def test_scaled_schedule_keeps_inria_proportions(total):
    cfg = VanillaDensityConfig().scaled(total)
    assert cfg.densify_until == total // 2
    assert 0 < cfg.densify_from < cfg.densify_until
    resets = len(range(cfg.opacity_reset_every, cfg.densify_until, cfg.opacity_reset_every))
    assert resets == 4 if total >= 10_000 else 1 <= resets <= 4  # as INRIA (3k..12k), fewer for short runs
    # The cadence is INRIA's: one densification can double the count, so it is never faster.
    assert cfg.densify_every == 100 and cfg.grad_threshold == VanillaDensityConfig().grad_threshold


def test_scaled_keeps_inria_numbers_for_30k_and_longer():
    assert VanillaDensityConfig().scaled(30_000) == VanillaDensityConfig()
    assert VanillaDensityConfig().scaled(100_000) == VanillaDensityConfig()
    short = VanillaDensityConfig().scaled(2000)
    assert (short.densify_from, short.densify_until, short.densify_every, short.opacity_reset_every) == (100, 1000, 100, 300)


def test_bad_settings_are_input_errors():
    with pytest.raises(InputError, match="densify_every"):
        VanillaDensityConfig(densify_every=0)
    with pytest.raises(InputError, match="max_gaussians"):
        VanillaDensityConfig(max_gaussians=0)
