"""The initial Gaussian sizes: each point's root mean square distance to its 3 nearest
neighbours (gaussians.mean_knn_distance), by all pairs up to ALL_PAIRS_POINTS and by the grid
search above, against a brute-force answer on clouds of mixed density."""

import pytest
import torch

from turbogs import gaussians


def brute_force(points: torch.Tensor, k: int = 3) -> torch.Tensor:
    """Every pair in float64, a loop over rows: independent of both code paths."""
    pts = points.double()
    out = torch.empty(len(pts), dtype=torch.float64)
    for i in range(len(pts)):
        d2 = (pts - pts[i]).pow(2).sum(-1)
        d2[i] = float("inf")
        out[i] = d2.topk(k, largest=False).values.clamp_min(1e-14).mean().sqrt()
    return out


def mixed_cloud(seed: int) -> torch.Tensor:
    """A tight cluster, a wide shell, a flat sheet, a far outlier and exact duplicates."""
    g = torch.Generator().manual_seed(seed)
    return torch.cat([
        torch.randn(700, 3, generator=g) * 0.01 + 2.0,
        torch.randn(500, 3, generator=g) * 5.0,
        torch.rand(500, 3, generator=g) * torch.tensor([4.0, 4.0, 1e-4]),
        torch.tensor([[400.0, -300.0, 250.0]]),
        torch.zeros(4, 3),
    ])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_grid_search_finds_the_exact_neighbours(seed):
    points = mixed_cloud(seed)
    torch.testing.assert_close(gaussians.grid_knn_distance(points, 3).double(), brute_force(points),
                               rtol=1e-6, atol=1e-9)


def test_both_paths_agree_and_the_large_one_is_the_grid(monkeypatch):
    """All pairs (exact differences: the cluster far from the origin is where |a|^2 + |b|^2 - 2ab
    cancels to noise) and the grid give the brute force's answer."""
    points = mixed_cloud(3)
    monkeypatch.setattr(gaussians, "ALL_PAIRS_POINTS", 10_000)
    by_pairs = gaussians.mean_knn_distance(points)
    torch.testing.assert_close(by_pairs.double(), brute_force(points), rtol=1e-6, atol=1e-9)
    calls = []
    grid = gaussians.grid_knn_distance
    monkeypatch.setattr(gaussians, "grid_knn_distance", lambda *args: calls.append(1) or grid(*args))
    monkeypatch.setattr(gaussians, "ALL_PAIRS_POINTS", 100)
    monkeypatch.setattr(gaussians, "PAIRS_PER_CHUNK", 5000)  # many chunks, and points alone over the limit
    by_grid = gaussians.mean_knn_distance(points)
    assert calls == [1]
    torch.testing.assert_close(by_grid, by_pairs, rtol=1e-5, atol=1e-8)


def test_degenerate_clouds():
    same = torch.ones(50, 3)
    assert torch.equal(gaussians.grid_knn_distance(same, 3), torch.full((50,), 1e-7))
    line = torch.arange(30.0)[:, None] * torch.tensor([[1.0, 0.0, 0.0]])  # neighbours 1 and 2 apart
    expected = brute_force(line).float()
    torch.testing.assert_close(gaussians.grid_knn_distance(line, 3), expected)
