"""Gaussian parameters, their activations, and initialisation from points.

Parameters are stored *pre-activation*, exactly as INRIA's .ply stores them, so that
optimizer steps act on unconstrained values:

| name      | shape          | activation            |
|-----------|----------------|-----------------------|
| means     | [N, 3]         | none                  |
| scales    | [N, 3]         | exp (log-scale)       |
| quats     | [N, 4] (wxyz)  | normalize             |
| opacities | [N]            | sigmoid (logit)       |
| sh0       | [N, 1, 3]      | SH DC coefficient     |
| shN       | [N, K-1, 3]    | higher SH bands       |
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional

import torch

SH_C0 = 0.28209479177387814  # Y_0^0, maps a DC coefficient to a color offset
PARAM_NAMES = ("means", "scales", "quats", "opacities", "sh0", "shN")


def rgb_to_sh(rgb: torch.Tensor) -> torch.Tensor:
    """Color in [0, 1] -> DC coefficient such that color = SH_C0 * dc + 0.5."""
    return (rgb - 0.5) / SH_C0


def num_sh_bases(degree: int) -> int:
    return (degree + 1) ** 2


# Up to this many points every pair is compared; above, all pairs would grow as N^2 (out of
# reach for the millions of points of a full-size SfM model), and a grid search finds the same
# neighbours, faster from a few thousand points on.
ALL_PAIRS_POINTS = 2048
PAIRS_PER_CHUNK = 1 << 22  # candidate pairs held at once by the grid search


def mean_knn_distance(points: torch.Tensor, k: int = 3, chunk: int = 4096) -> torch.Tensor:
    """Root mean square distance of each point to its k nearest neighbours (INRIA's distCUDA2),
    the initial size of a Gaussian. Exact: up to ALL_PAIRS_POINTS points by comparing every
    pair (in chunks, memory O(chunk * N)), above by `grid_knn_distance`."""
    n = points.shape[0]
    if n <= 1:
        return torch.ones(n, dtype=points.dtype)
    k = min(k, n - 1)
    if n > ALL_PAIRS_POINTS:
        return grid_knn_distance(points, k)
    out = torch.empty(n, dtype=points.dtype)
    for start in range(0, n, chunk):
        block = points[start : start + chunk]
        # the differences themselves, not |a|^2 + |b|^2 - 2ab: that cancels to noise for a tight
        # cluster far from the origin
        d2 = torch.cdist(block, points, compute_mode="donot_use_mm_for_euclid_dist").pow_(2)
        d2[torch.arange(block.shape[0]), torch.arange(start, start + block.shape[0])] = float("inf")
        nearest = d2.topk(k, dim=1, largest=False).values
        out[start : start + chunk] = nearest.clamp_min(1e-14).mean(dim=1).sqrt()
    return out


def grid_knn_distance(points: torch.Tensor, k: int) -> torch.Tensor:
    """mean_knn_distance's answer by a search in cubic cells, exact for any mix of densities.
    With cells of side c, every point within c of a point lies in the 27 cells around its own,
    so a point whose k-th nearest candidate there is within c has its answer. The cells start
    far finer than the points' mean spacing and double until every point has one: a point in a
    dense cluster is answered while its cells still hold few points, one far from everything
    when they have grown to its spacing; a level costs a sort of the points and the pairs of
    the points still waiting, and a crowded cell is searched only for those beside it."""
    n, device = points.shape[0], points.device
    pts = points.double()
    low = pts.min(dim=0).values
    span = float((pts.max(dim=0).values - low).max())
    out = torch.empty(n, dtype=points.dtype, device=device)
    todo = torch.arange(n, device=device)
    if span == 0.0:  # every point in one place
        return out.fill_(1e-7)
    # 64x finer than the mean spacing: a cluster that much closer-packed than the cloud still starts
    # with a few points a cell
    side = span / n ** (1 / 3) / 64
    offsets = torch.stack(torch.meshgrid(*[torch.arange(-1, 2, device=device)] * 3, indexing="ij"), -1).reshape(-1, 3)
    while todo.numel():
        cells = torch.floor((pts - low) / side).long()  # [N, 3]
        stride = int(cells.max()) + 3
        keys = _cell_keys(cells, stride)
        order = torch.argsort(keys)
        unique, counts = torch.unique_consecutive(keys[order], return_counts=True)
        starts = torch.cumsum(counts, 0) - counts
        answered = []
        for query, found, sizes in _query_chunks(todo, cells, offsets, stride, unique, counts):
            present = sizes > 0
            pair_query = torch.repeat_interleave(torch.arange(query.numel(), device=device), sizes.sum(1))
            first = torch.where(present, starts[found], 0).reshape(-1)
            cell_of_pair = torch.repeat_interleave(torch.arange(first.numel(), device=device), sizes.reshape(-1))
            within = torch.arange(cell_of_pair.numel(), device=device) - torch.repeat_interleave(
                torch.cumsum(sizes.reshape(-1), 0) - sizes.reshape(-1), sizes.reshape(-1))
            candidate = order[first[cell_of_pair] + within]
            d2 = (pts[candidate] - pts[query[pair_query]]).pow(2).sum(-1)
            d2 = torch.where(candidate == query[pair_query], float("inf"), d2)
            best = _k_smallest_per_query(d2, pair_query, query.numel(), k)  # [Q, k], inf where missing
            done = torch.isfinite(best[:, -1]) & (best[:, -1] <= side * side)
            out[query[done]] = best[done].clamp_min(1e-14).mean(dim=1).sqrt().to(out.dtype)
            answered.append(query[done])
        if answered:
            finished = torch.zeros(n, dtype=torch.bool, device=device)
            finished[torch.cat(answered)] = True
            todo = todo[~finished[todo]]
        side *= 2.0
    return out


def _cell_keys(cells: torch.Tensor, stride: int) -> torch.Tensor:
    """One int64 per cell [..., 3] (indices from -1 up to stride - 2 on each axis), ordered as
    the cells are, x first."""
    return ((cells[..., 0] + 1) * stride + cells[..., 1] + 1) * stride + cells[..., 2] + 1


def _query_chunks(todo, cells, offsets, stride, unique, counts):
    """The waiting points in chunks whose candidate pairs fit PAIRS_PER_CHUNK (a point alone
    over the limit is a chunk of its own), each with its 27 cells: their index among the
    occupied cells [Q, 27] and how many points each holds (0: none)."""
    keys = _cell_keys(cells[todo][:, None, :] + offsets[None], stride)  # [T, 27]
    found = torch.searchsorted(unique, keys).clamp(max=unique.numel() - 1)
    sizes = torch.where(unique[found] == keys, counts[found], 0)
    start, total = 0, int(todo.numel())
    cumulative = torch.cumsum(sizes.sum(1), 0)
    while start < total:
        before = int(cumulative[start - 1]) if start else 0
        end = int(torch.searchsorted(cumulative, torch.tensor(before + PAIRS_PER_CHUNK, device=cumulative.device),
                                     right=True))
        end = max(end, start + 1)
        yield todo[start:end], found[start:end], sizes[start:end]
        start = end


def _k_smallest_per_query(d2, pair_query, num_queries, k):
    """[Q, k]: the k smallest d2 of each query's pairs (pairs grouped by query, ascending),
    inf where a query has fewer."""
    order = torch.argsort(d2)
    order = order[torch.argsort(pair_query[order], stable=True)]  # by query, then by distance
    grouped, values = pair_query[order], d2[order]
    counts = torch.bincount(grouped, minlength=num_queries)
    first = torch.cumsum(counts, 0) - counts
    best = torch.full((num_queries, k), float("inf"), dtype=d2.dtype, device=d2.device)
    rank = torch.arange(grouped.numel(), device=d2.device) - first[grouped]
    keep = rank < k
    best[grouped[keep], rank[keep]] = values[keep]
    return best


class Gaussians(torch.nn.Module):
    """A set of 3D Gaussians: a ParameterDict plus the active SH degree."""

    def __init__(self, params: Dict[str, torch.Tensor], sh_degree: int, active_sh_degree: int = 0,
                 antialiased: bool = False):
        super().__init__()
        self.params = torch.nn.ParameterDict(
            {name: torch.nn.Parameter(params[name].contiguous()) for name in PARAM_NAMES}
        )
        self.sh_degree = sh_degree  # the maximum degree stored in shN
        self.active_sh_degree = active_sh_degree  # raised during training
        # How the model is meant to be rendered: with Mip-Splatting's 2D filter and opacity
        # compensation (--antialiased). A property of the model, not of one render: its
        # opacities were trained against that compensation, so every render of it uses it.
        self.antialiased = antialiased

    # --- construction -------------------------------------------------------------
    @classmethod
    def from_points(
        cls,
        points: torch.Tensor,
        colors: torch.Tensor,
        sh_degree: int = 3,
        init_opacity: float = 0.1,
        init_scale: float = 1.0,
    ) -> "Gaussians":
        """INRIA's initialisation: isotropic Gaussians sized by neighbour distance,
        identity rotation, opacity 0.1, color in the DC band."""
        points = points.float()
        n = points.shape[0]
        dist = mean_knn_distance(points).clamp_min(1e-7) * init_scale
        quats = torch.zeros(n, 4)
        quats[:, 0] = 1.0
        params = {
            "means": points.clone(),
            "scales": torch.log(dist)[:, None].repeat(1, 3),
            "quats": quats,
            "opacities": torch.logit(torch.full((n,), init_opacity)),
            "sh0": rgb_to_sh(colors.float().clamp(0, 1))[:, None, :],
            "shN": torch.zeros(n, num_sh_bases(sh_degree) - 1, 3),
        }
        return cls(params, sh_degree)

    # --- views --------------------------------------------------------------------
    def __len__(self) -> int:
        return self.params["means"].shape[0]

    @property
    def means(self) -> torch.Tensor:
        return self.params["means"]

    @property
    def scales(self) -> torch.Tensor:
        return torch.exp(self.params["scales"])

    @property
    def quats(self) -> torch.Tensor:
        return torch.nn.functional.normalize(self.params["quats"], dim=-1)

    @property
    def opacities(self) -> torch.Tensor:
        return torch.sigmoid(self.params["opacities"])

    @property
    def sh(self) -> torch.Tensor:
        """All SH coefficients [N, K, 3]."""
        return torch.cat([self.params["sh0"], self.params["shN"]], dim=1)

    def gradient_columns(self) -> List[Optional[int]]:
        """Per parameter (in `params`' order), how many leading coefficients (dim 1) of its
        gradient can be nonzero; None for all. Of the higher SH bands only the active degree's:
        the renderer leaves the others' gradient exactly 0 (tests/test_render.py), so a step of
        several ranks does not send them (two thirds of the gradient while the degree is 0)."""
        return [num_sh_bases(self.active_sh_degree) - 1 if name == "shN" else None for name in self.params]

    def raw(self) -> Dict[str, torch.Tensor]:
        """Detached pre-activation tensors, for saving."""
        return {k: v.detach() for k, v in self.params.items()}

    def replace(self, params: Dict[str, torch.Tensor]) -> None:
        """Swap in new tensors (after densification or loading); rows may change."""
        for name in PARAM_NAMES:
            self.params[name] = torch.nn.Parameter(params[name].contiguous())


def sh_degree_from_coeffs(num_rest: int) -> int:
    """The SH degree implied by the number of higher-band coefficients per channel."""
    degree = int(round(math.sqrt(num_rest + 1))) - 1
    if num_sh_bases(degree) - 1 != num_rest:
        raise ValueError(f"{num_rest} higher-band SH coefficients match no SH degree")
    return degree
