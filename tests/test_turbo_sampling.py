"""Error memory and tile sampler (torch twins): bookkeeping, schedule, and sampled
frequencies against the stated probabilities."""

import io
import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from turbogs import kernels as ops
from turbogs.errors import TurboGSError
from turbogs.turbo.sampling import ErrorMemory, SamplerConfig, TileSampler

# Chi-square critical values at p = 0.001 (standard tables), by degrees of freedom.
CHI2_CRITICAL_0001 = {3: 16.266, 5: 20.515}


def chi_square(counts, probabilities):
    counts = np.asarray(counts, dtype=float)
    expected = counts.sum() * np.asarray(probabilities, dtype=float)
    return float(((counts - expected) ** 2 / expected).sum())


def seen_memory(view_errors, height=32, width=32, decay=0.7):
    """A memory whose views (all height x width) have every tile seen with the given errors."""
    memory = ErrorMemory([(height, width)] * len(view_errors), ema_decay=decay)
    for view, errors in enumerate(view_errors):
        errors = torch.as_tensor(errors, dtype=torch.float32)
        memory.update(view, torch.arange(len(errors)), errors)
    return memory


# --- memory ---------------------------------------------------------------------------------


def test_memory_layout_for_views_of_different_sizes():
    memory = ErrorMemory([(20, 40), (64, 64), (16, 16)])
    assert [memory.grid(v) for v in range(3)] == [(2, 3), (4, 4), (1, 1)]
    assert memory.tile_counts.tolist() == [6, 16, 1]
    assert memory.errors.shape == (3, 16) and memory.errors.dtype == torch.float32
    assert torch.isinf(memory.errors[0, :6]).all() and (memory.errors[0, 6:] == 0).all()
    assert torch.isinf(memory.errors[1]).all()
    assert memory.view_error(0).shape == (2, 3)
    assert memory.seen_fraction() == 0.0
    cameras = [SimpleNamespace(height=20, width=40), SimpleNamespace(height=16, width=16)]
    assert ErrorMemory.from_cameras(cameras).grids == [(2, 3), (1, 1)]


def test_memory_update_first_replaces_then_ema():
    memory = ErrorMemory([(20, 40), (16, 16)], ema_decay=0.7)
    memory.update(0, torch.tensor([1, 4]), torch.tensor([0.5, 2.0]))
    assert memory.view_error(0).flatten().tolist()[1] == 0.5
    assert memory.view_error(0).flatten().tolist()[4] == 2.0
    assert torch.isinf(memory.errors[0, [0, 2, 3, 5]]).all()
    memory.update(0, torch.tensor([4, 1]), torch.tensor([1.0, 0.5]))
    assert float(memory.errors[0, 4]) == pytest.approx(0.7 * 2.0 + 0.3 * 1.0)
    assert float(memory.errors[0, 1]) == pytest.approx(0.5)
    # Non-finite errors and ids outside the view's grid are ignored.
    memory.update(0, torch.tensor([4, 6, 0]), torch.tensor([float("nan"), 3.0, float("inf")]))
    assert float(memory.errors[0, 4]) == pytest.approx(1.7)
    assert torch.isinf(memory.errors[0, 0])
    assert torch.isinf(memory.errors[1, 0])  # other views untouched
    memory.update(1, torch.tensor([3, -1]), torch.tensor([1.0, 1.0]))  # view 1 has 1 tile: 3 is padding
    assert (memory.errors[1, 1:] == 0).all() and torch.isinf(memory.errors[1, 0])
    assert memory.seen_fraction() == pytest.approx(2 / 7)


def test_view_error_is_a_copy_in_grid_layout():
    memory = ErrorMemory([(20, 40)])
    memory.update(0, torch.tensor([5]), torch.tensor([0.25]))  # ty = 1, tx = 2
    heat = memory.view_error(0)
    assert float(heat[1, 2]) == 0.25
    heat[1, 2] = 9.0
    assert float(memory.errors[0, 5]) == 0.25


def test_memory_state_dict_round_trip_and_mismatch():
    memory = ErrorMemory([(20, 40), (16, 16)])
    memory.update(0, torch.tensor([0, 3]), torch.tensor([0.1, 0.2]))
    buffer = io.BytesIO()
    torch.save(memory.state_dict(), buffer)
    buffer.seek(0)
    restored = ErrorMemory([(20, 40), (16, 16)])
    restored.load_state_dict(torch.load(buffer))
    assert torch.equal(restored.errors, memory.errors)
    with pytest.raises(TurboGSError, match="views"):
        ErrorMemory([(20, 40)]).load_state_dict(memory.state_dict())
    with pytest.raises(TurboGSError, match="views"):
        ErrorMemory([(20, 48), (16, 16)]).load_state_dict(memory.state_dict())


# --- schedule ---------------------------------------------------------------------------------


def test_fraction_schedule_and_tiles_per_step():
    cfg = SamplerConfig(fraction_start=1.0, fraction_end=0.25, dense_until=0.1, sparse_from=0.5)
    assert cfg.fraction_at(0.0) == 1.0 and cfg.fraction_at(0.1) == 1.0
    assert cfg.fraction_at(0.3) == pytest.approx(0.625)
    assert cfg.fraction_at(0.5) == 0.25 and cfg.fraction_at(1.0) == 0.25 and cfg.fraction_at(7) == 0.25
    sampler = TileSampler(ErrorMemory([(20, 40), (16, 160)]), cfg)  # 6 and 10 tiles
    assert sampler.tiles_per_step(0, 0.0) == 6
    assert sampler.tiles_per_step(0, 1.0) == 2  # ceil(1.5)
    assert sampler.tiles_per_step(1, 1.0) == 3  # ceil(2.5)
    assert TileSampler(sampler.memory, SamplerConfig(fraction_end=0.3)).tiles_per_step(1, 1.0) == 3  # not 4
    assert TileSampler(sampler.memory, SamplerConfig(fraction_end=0.01)).tiles_per_step(0, 1.0) == 1


def test_sampler_config_rejects_bad_values():
    with pytest.raises(TurboGSError, match="fraction_end"):
        SamplerConfig(fraction_end=0.0)
    with pytest.raises(TurboGSError, match="dense_until"):
        SamplerConfig(dense_until=0.6, sparse_from=0.5)
    with pytest.raises(TurboGSError, match="ema_decay"):
        SamplerConfig(ema_decay=1.0)


# --- sampling ---------------------------------------------------------------------------------


def test_sample_shapes_mask_and_k():
    memory = ErrorMemory([(40, 50)])  # 3 x 4 tiles
    sampler = TileSampler(memory, SamplerConfig(), seed=1)
    sample = sampler.sample(1.0)
    assert sample.view == 0
    assert sample.tile_ids.dtype == torch.int64 and len(sample.tile_ids) == 3  # ceil(0.25 x 12)
    assert torch.equal(sample.tile_ids, torch.unique(sample.tile_ids))  # sorted and distinct
    assert sample.tile_mask.shape == (3, 4) and sample.tile_mask.dtype == torch.bool
    assert torch.equal(sample.tile_mask.flatten().nonzero().flatten(), sample.tile_ids)


def test_unseen_views_and_tiles_come_first():
    # View 1 is fully seen with a huge error; view 0 still has 6 unseen tiles.
    memory = ErrorMemory([(64, 64), (64, 64)])
    memory.update(1, torch.arange(16), torch.full((16,), 100.0))
    memory.update(0, torch.arange(10), torch.full((10,), 100.0))
    sampler = TileSampler(memory, SamplerConfig(fraction_end=0.25), seed=0)  # K = 4 late in the run
    chosen_tiles = set()
    for _ in range(30):
        sample = sampler.sample(1.0)
        assert sample.view == 0
        assert (sample.tile_ids >= 10).all()  # only unseen tiles while K <= #unseen
        chosen_tiles.update(sample.tile_ids.tolist())
    assert chosen_tiles == set(range(10, 16))  # uniformly random among the unseen
    sample = sampler.sample(0.0)  # K = 16 >= #unseen: all of them plus others
    assert set(range(10, 16)) <= set(sample.tile_ids.tolist())


def test_a_fresh_memory_is_covered_in_the_first_dense_pass():
    memory = ErrorMemory([(32, 48), (16, 32), (48, 16)])
    sampler = TileSampler(memory, SamplerConfig(), seed=3)
    views = []
    for _ in range(3):
        sample = sampler.sample(0.0)  # dense: every tile of the view
        views.append(sample.view)
        memory.update(sample.view, sample.tile_ids, torch.rand(len(sample.tile_ids)))
    assert sorted(views) == [0, 1, 2]
    assert memory.seen_fraction() == 1.0


def test_view_frequencies_follow_mean_error_plus_floor():
    view_means = [0.0, 0.1, 0.3, 0.6]
    memory = seen_memory([[m] * 4 for m in view_means])
    sampler = TileSampler(memory, SamplerConfig(view_floor=0.2), seed=4)
    draws = 2000
    counts = np.bincount([sampler.sample(1.0).view for _ in range(draws)], minlength=4)
    weights = np.array(view_means) + 0.2 * np.mean(view_means)  # 0.05, 0.15, 0.35, 0.65
    probabilities = weights / weights.sum()
    assert chi_square(counts, probabilities) < CHI2_CRITICAL_0001[3]
    assert counts[0] > 0  # the floor keeps an error-free view alive


def test_tile_pairs_follow_sequential_sampling_without_replacement():
    errors = [0.05, 0.2, 0.5, 1.0]
    memory = seen_memory([errors])
    cfg = SamplerConfig(gamma=2.0, tile_floor=0.5, fraction_end=0.5)  # K = 2 of 4 tiles
    sampler = TileSampler(memory, cfg, seed=5)
    powered = np.array(errors) ** 2
    weights = powered + 0.5 * powered.mean()
    total = weights.sum()
    pairs = list(itertools.combinations(range(4), 2))
    # P({i, j}) = P(i first, then j) + P(j first, then i), brute force over the orders.
    probabilities = [
        sum(weights[a] / total * weights[b] / (total - weights[a]) for a, b in ((i, j), (j, i))) for i, j in pairs
    ]
    assert math.isclose(sum(probabilities), 1.0)
    draws = 3000
    counts = np.zeros(len(pairs))
    for _ in range(draws):
        counts[pairs.index(tuple(sampler.sample(1.0).tile_ids.tolist()))] += 1
    assert chi_square(counts, probabilities) < CHI2_CRITICAL_0001[5]


def test_gumbel_keys_of_seen_tiles_are_log_weight_plus_gumbel():
    errors_row = torch.tensor([0.5, 0.0, float("inf"), 2.0])
    u = torch.tensor([0.3, 0.9, 0.5, 0.1])
    keys = ops.tile_sample_keys(errors_row, 1.5, 0.2, u)
    powered = np.array([0.5, 0.0, 2.0]) ** 1.5
    floor = 0.2 * powered.mean()
    gumbel = -np.log(-np.log(u.numpy().astype(np.float64)))
    expected_seen = np.log(powered + floor) + gumbel[[0, 1, 3]]
    np.testing.assert_allclose(keys[[0, 1, 3]].numpy(), expected_seen, rtol=1e-5)
    assert float(keys[2]) == pytest.approx(1000.0 + gumbel[2])


def test_sampler_is_reproducible_and_resumable():
    memory = seen_memory([[0.1, 0.5, 0.2, 0.9], [0.3, 0.3, 0.3, 0.3]])
    first = TileSampler(memory, SamplerConfig(fraction_end=0.5), seed=7)
    second = TileSampler(memory, SamplerConfig(fraction_end=0.5), seed=7)
    run = lambda s, n: [(x.view, tuple(x.tile_ids.tolist())) for x in (s.sample(1.0) for _ in range(n))]
    assert run(first, 20) == run(second, 20)
    state = first.state_dict()
    expected = run(first, 10)
    resumed = TileSampler(memory, SamplerConfig(fraction_end=0.5), seed=123)
    resumed.load_state_dict(state)
    assert run(resumed, 10) == expected
    with pytest.raises(TurboGSError, match="sampler state"):
        resumed.load_state_dict({"generator": torch.zeros(3, dtype=torch.uint8)})
