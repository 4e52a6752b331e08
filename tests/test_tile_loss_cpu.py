"""The native CPU tile loss (cuda/cpu/tile_loss_cpu.cpp) against its twin, the oracle.

A view whose tiles include partial ones at the right and bottom edges, a fractional mask
with fully masked tiles, NaN in every uncounted pixel, a tile listed twice and an id outside
the grid; patch sizes that differ between SSIM and NCC. Forward and gradients close to the
twin's (float32), far closer in float64; the same bits on 1 and 2 threads; the dispatch.
tests/test_turbo_losses.py runs its loop references and gradcheck on both paths too.
"""

from __future__ import annotations

import pytest
import torch
from test_raster_cpu import native  # noqa: F401  (skip without a compiler, fail on a broken build)

from turbogs import kernels
from turbogs.kernels import turbo_cpu, turbo_torch
from turbogs.turbo.losses import LossConfig

HEIGHT, WIDTH = 75, 106  # 5 x 7 tiles of 16, the last row and column partial


def make_view(seed: int, dtype, masked: bool):
    """(render with NaN where uncounted, gt, mask or None, tile ids)."""
    g = torch.Generator().manual_seed(seed)
    gt = torch.rand(HEIGHT, WIDTH, 3, generator=g, dtype=dtype)
    render = (gt + 0.2 * torch.randn(HEIGHT, WIDTH, 3, generator=g, dtype=dtype)).clamp(0, 1)
    render[40:56, 30:40] = gt[40:56, 30:40] * 0.5 + 0.3  # an affine copy: NCC near 1
    gt[0:16, 16:32] = 0.4  # a flat ground-truth tile: NCC confidence 0
    mask = None
    if masked:
        mask = torch.rand(HEIGHT, WIDTH, generator=g, dtype=dtype)
        mask[mask < 0.3] = 0.0
        mask[16:32, 0:16] = 0.0  # a fully masked tile
        render[mask == 0] = float("nan")
    ids = torch.tensor([0, 1, 5, 6, 7, 8, 13, 20, 27, 33, 34, 12, 6, 35 + 4], dtype=torch.int64)  # 6 twice, 39 off
    return render, gt, mask, ids


def loss_with(backend, view, cfg):
    render, gt, mask, ids = view
    leaf = render.detach().clone().requires_grad_()
    loss, tile_errors = backend.tile_loss(leaf, gt, ids, mask, cfg)
    (2.5 * loss).backward()
    return loss.detach(), tile_errors, leaf.grad


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("patches", [(8, 8), (4, 8), (16, 2)])
def test_native_tile_loss_matches_the_twin(dtype, tol, masked, patches):
    view = make_view(0, dtype, masked)
    cfg = LossConfig(ssim_patch=patches[0], ncc_patch=patches[1], lambda_ncc=0.5)
    got, want = loss_with(turbo_cpu, view, cfg), loss_with(turbo_torch, view, cfg)
    for name, a, b in zip(["loss", "tile errors", "gradient"], got, want):
        assert bool(torch.isfinite(a).all()), name
        error = float((a - b).abs().max() / b.abs().max())
        assert error <= tol, f"{name}: {error:.2e} of the largest"
    tile_errors, grad = got[1], got[2]
    assert float(tile_errors[-1]) == 0.0  # the id outside the grid: an empty tile
    if masked:
        assert float(tile_errors[list(view[3]).index(13)]) > 0
        assert bool((grad[view[2] == 0] == 0).all())  # uncounted pixels: no gradient
    # Pixels of tiles not listed get nothing: tile 2 (x 32..48, y 0..16) is not in the list.
    assert float(grad[0:16, 32:48].abs().max()) == 0.0


def test_other_tile_sizes_match_the_twin():
    view = make_view(1, torch.float64, True)
    for tile_size, patch in [(8, 4), (32, 8)]:
        cfg = LossConfig(tile_size=tile_size, ssim_patch=patch, ncc_patch=patch)
        th, tw = -(-HEIGHT // tile_size), -(-WIDTH // tile_size)
        ids = torch.arange(th * tw)
        got = loss_with(turbo_cpu, view[:3] + (ids,), cfg)
        want = loss_with(turbo_torch, view[:3] + (ids,), cfg)
        for a, b in zip(got, want):
            assert float((a - b).abs().max() / b.abs().max()) <= 1e-12


def test_native_tile_loss_does_not_depend_on_the_thread_count():
    view = make_view(2, torch.float32, True)
    before = torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            runs.append(loss_with(turbo_cpu, view, LossConfig()))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_the_dispatch_takes_the_native_tile_loss_unless_the_twins_are_asked_for(monkeypatch):
    calls = []
    monkeypatch.setattr(turbo_cpu, "fused_tile_loss", lambda *args: calls.append(1) or (torch.zeros(()), None))
    render, gt, _, ids = make_view(3, torch.float32, False)
    kernels.use_torch_twins(False)
    kernels.tile_loss(render, gt, ids, None, LossConfig())
    assert len(calls) == 1
    kernels.use_torch_twins(True)
    try:
        loss, _ = kernels.tile_loss(render, gt, ids, None, LossConfig())
    finally:
        kernels.use_torch_twins(False)
    assert len(calls) == 1 and loss > 0
    # float16 and other dtypes: the twin.
    assert kernels._turbo_for(render.half()) is turbo_torch
