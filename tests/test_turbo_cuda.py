"""The CUDA kernels of cuda/ against their torch twins (turbogs/kernels/turbo_torch.py).

Every comparison runs twice:
- "gpu" (marked cuda; skipped only without a CUDA device): turbogs._C on the GPU,
  built by setup.py or just in time.
- "cpu-emulation": the same kernel source compiled with g++ through cuda/cpu_emulation.h,
  which runs each block's threads as std::threads (needs g++ and the CUDA headers of
  nvcc, no GPU). It checks the kernels' indexing, reductions and formulas, and the
  autograd glue of turbogs/turbo/_cuda.py, on machines without a GPU.
"""

import ctypes
import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from turbogs.kernels import turbo_cuda as _cuda
from turbogs.kernels import turbo_torch as _torch_impl
from turbogs.turbo.losses import LossConfig, TileLoss

CUDA_DIR = Path(__file__).resolve().parents[1] / "cuda"


# --- the emulated turbogs._C ---------------------------------------------------------------


def _ptr(tensor):
    return None if tensor is None else ctypes.c_void_p(tensor.data_ptr())


class EmulatedC:
    """turbogs._C's functions (cuda/bindings.cpp) on CPU tensors, over emulated launchers."""

    def __init__(self, library_path):
        self.lib = ctypes.CDLL(str(library_path))

    def memory_update(self, errors, view, num_tiles, tile_ids, tile_errors, decay):
        row = ctypes.c_void_p(errors.data_ptr() + view * errors.shape[1] * errors.element_size())
        self.lib.emu_memory_update(row, ctypes.c_int64(num_tiles), _ptr(tile_ids), _ptr(tile_errors),
                                   ctypes.c_int64(tile_ids.numel()), ctypes.c_float(decay))

    def view_sample_keys(self, errors, tile_counts, view_floor, uniforms):
        num_views, max_tiles = errors.shape
        scratch, keys = torch.empty(2 * num_views), torch.empty(num_views)
        self.lib.emu_view_sample_keys(_ptr(errors), _ptr(tile_counts), ctypes.c_int64(num_views),
                                      ctypes.c_int64(max_tiles), ctypes.c_float(view_floor), _ptr(uniforms),
                                      _ptr(scratch), _ptr(keys))
        return keys

    def tile_sample_keys(self, errors_row, gamma, tile_floor, uniforms):
        keys = torch.empty(errors_row.numel())
        self.lib.emu_tile_sample_keys(_ptr(errors_row), ctypes.c_int64(errors_row.numel()), ctypes.c_float(gamma),
                                      ctypes.c_float(tile_floor), _ptr(uniforms), _ptr(keys))
        return keys

    def _loss_args(self, render, gt, mask, tile_ids, tile_size, ssim_patch, ncc_patch, *floats):
        height, width = render.shape[:2]
        ints = (height, width, tile_size, ssim_patch, ncc_patch)
        return ([_ptr(render), _ptr(gt), _ptr(mask), _ptr(tile_ids), ctypes.c_int64(tile_ids.numel())]
                + [ctypes.c_int(v) for v in ints] + [ctypes.c_float(v) for v in floats])

    def tile_loss_forward(self, render, gt, mask, tile_ids, *params):
        tile_loss, tile_weight = torch.zeros(tile_ids.numel()), torch.zeros(tile_ids.numel())
        self.lib.emu_tile_loss_forward(*self._loss_args(render, gt, mask, tile_ids, *params),
                                       _ptr(tile_loss), _ptr(tile_weight))
        return tile_loss, tile_weight

    def tile_loss_backward(self, render, gt, mask, tile_ids, tile_scale, *params):
        grad = torch.zeros_like(render)
        self.lib.emu_tile_loss_backward(*self._loss_args(render, gt, mask, tile_ids, *params),
                                        _ptr(tile_scale), _ptr(grad))
        return grad


@pytest.fixture(scope="module")
def emulated_library(tmp_path_factory):
    nvcc, gxx = shutil.which("nvcc"), shutil.which("g++")
    if nvcc is None or gxx is None:
        pytest.skip("the CPU emulation needs g++ and the CUDA headers of nvcc")
    spec = importlib.util.spec_from_file_location("turbogs_cuda_build", CUDA_DIR / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    cuda_root = build.nvcc_cuda_root(nvcc)
    folder = tmp_path_factory.mktemp("cuda_emulation")
    source = folder / "emulation.cpp"
    includes = ['#include "cpu_emulation.h"'] + [f'#include "{p.name}"' for p in sorted(CUDA_DIR.glob("*.cu"))]
    source.write_text("\n".join(includes) + "\n")
    library = folder / "emulation.so"
    command = [gxx, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", f"-I{CUDA_DIR}",
               f"-I{cuda_root / 'include'}", str(source), "-o", str(library)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]
    return library


@pytest.fixture(params=["cpu-emulation", pytest.param("gpu", marks=pytest.mark.cuda)])
def device(request, monkeypatch):
    """The device the kernels under test run on; _cuda's functions call those kernels."""
    if request.param == "gpu":
        if not torch.cuda.is_available():
            pytest.skip("no CUDA device")
        assert _cuda.available(), "a CUDA device is present but turbogs._C could not be built or loaded"
        return torch.device("cuda")
    emulated = EmulatedC(request.getfixturevalue("emulated_library"))
    monkeypatch.setattr(_cuda, "_module", lambda: emulated)
    return torch.device("cpu")


# --- error memory and sampling keys ---------------------------------------------------------


def random_memory(seed=0):
    """Errors [5, 40] with per-view counts, some unseen (+inf) tiles, padding after the count."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.tensor([40, 12, 7, 33, 1])
    errors = torch.rand(5, 40, generator=gen) * 2
    errors[torch.rand(5, 40, generator=gen) < 0.1] = float("inf")
    errors[0, 3] = 0.0
    for view, count in enumerate(counts.tolist()):
        errors[view, count:] = 0.0
    errors[1, :12] = torch.rand(12, generator=gen)  # views 1 and 4 are fully seen
    errors[4, 0] = 0.7
    return errors, counts


def test_memory_update_matches_twin(device):
    errors, counts = random_memory(1)
    ids = torch.tensor([0, 5, 3, 39, 41, -2, 17, 8])
    values = torch.tensor([0.5, 0.25, float("nan"), 1.5, 2.0, 1.0, float("inf"), 0.125])
    expected = errors.clone()
    _torch_impl.memory_update(expected, 0, 40, ids, values, 0.7)
    actual = errors.clone().to(device)
    _cuda.memory_update(actual, 0, 40, ids.to(device), values.to(device), 0.7)
    torch.testing.assert_close(actual.cpu(), expected, rtol=1e-6, atol=0)
    assert not torch.equal(expected, errors)  # the update did something


def test_view_keys_match_twin(device):
    errors, counts = random_memory(2)
    uniforms = torch.rand(5, generator=torch.Generator().manual_seed(3))
    expected = _torch_impl.view_sample_keys(errors, counts, 0.1, uniforms)
    actual = _cuda.view_sample_keys(errors.to(device), counts.to(device), 0.1, uniforms.to(device)).cpu()
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    seen_only = errors.clone()
    seen_only[torch.isinf(seen_only)] = 0.3  # now no view has unseen tiles: weighted keys only
    expected = _torch_impl.view_sample_keys(seen_only, counts, 0.1, uniforms)
    actual = _cuda.view_sample_keys(seen_only.to(device), counts.to(device), 0.1, uniforms.to(device)).cpu()
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    assert int(actual.argmax()) == int(expected.argmax())


@pytest.mark.parametrize("gamma,tile_floor", [(1.0, 0.1), (2.0, 0.0), (0.5, 1.0)])
def test_tile_keys_and_topk_match_twin(device, gamma, tile_floor):
    errors, _ = random_memory(4)
    row = errors[3, :33].contiguous()
    uniforms = torch.rand(33, generator=torch.Generator().manual_seed(5))
    expected = _torch_impl.tile_sample_keys(row, gamma, tile_floor, uniforms)
    actual = _cuda.tile_sample_keys(row.to(device), gamma, tile_floor, uniforms.to(device)).cpu()
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    chosen = lambda keys: set(torch.topk(keys, 10).indices.tolist())
    assert chosen(actual) == chosen(expected)


# --- tile loss ------------------------------------------------------------------------------


def loss_inputs(height, width, seed, tile_size):
    gen = torch.Generator().manual_seed(seed)
    gt = torch.rand(height, width, 3, generator=gen)
    render = (gt + 0.15 * torch.randn(height, width, 3, generator=gen)).clamp(0, 1)
    render[: height // 3, : width // 4] = 0.4  # a flat region
    gt[-3:, :] = 0.6  # a flat ground-truth strip
    mask = (torch.rand(height, width, generator=gen) > 0.15).float()
    mask[:, :3] = 0.5
    tiles_x = -(-width // tile_size)
    tiles_y = -(-height // tile_size)
    # Sampled tiles (including the partial last row and column) and NaN everywhere else.
    ids = torch.tensor(sorted({0, tiles_x - 1, tiles_x * tiles_y - 1, tiles_x + 1, tiles_x * (tiles_y - 1)}))
    sampled = torch.zeros(tiles_x * tiles_y, dtype=torch.bool)
    sampled[ids] = True
    pixel_tile = (torch.arange(height)[:, None] // tile_size) * tiles_x + torch.arange(width)[None, :] // tile_size
    render[~sampled[pixel_tile]] = float("nan")
    return render, gt, mask, ids


@pytest.mark.parametrize(
    "cfg",
    [
        LossConfig(),
        LossConfig(ssim_patch=16, ncc_patch=4, lambda_ncc=0.5),
        LossConfig(tile_size=8, ssim_patch=4, ncc_patch=8),
    ],
    ids=["default", "patches-16-4", "tile-8"],
)
def test_tile_loss_forward_and_backward_match_twin(device, cfg):
    render, gt, mask, ids = loss_inputs(37, 45, seed=6, tile_size=cfg.tile_size)
    for m in (mask, None):
        twin_render = render.clone().requires_grad_(True)
        twin_loss, twin_errors = _torch_impl.tile_loss(twin_render, gt, ids, m, cfg)
        (3.0 * twin_loss).backward()

        kernel_render = render.clone().to(device).requires_grad_(True)
        kernel_loss, kernel_errors = _cuda.tile_loss(
            kernel_render, gt.to(device), ids.to(device), None if m is None else m.to(device), cfg
        )
        (3.0 * kernel_loss).backward()

        torch.testing.assert_close(kernel_loss.detach().cpu(), twin_loss.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(kernel_errors.cpu(), twin_errors, rtol=1e-5, atol=1e-6)
        assert not kernel_errors.requires_grad
        grad = kernel_render.grad.cpu()
        assert torch.isfinite(grad).all()
        torch.testing.assert_close(grad, twin_render.grad, rtol=1e-4, atol=1e-6)
        assert grad.abs().max() > 0


# --- on the GPU, through the dispatch point -------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_gpu_dispatch_runs_sampler_memory_and_loss_on_the_device():
    from turbogs.turbo.sampling import ErrorMemory, SamplerConfig, TileSampler

    memory = ErrorMemory([(37, 45), (32, 32)], device="cuda")
    sampler = TileSampler(memory, SamplerConfig(), seed=0)
    render, gt, mask, _ = loss_inputs(37, 45, seed=7, tile_size=16)
    render = torch.nan_to_num(render, nan=0.5)
    sample = sampler.sample(0.0)
    assert sample.tile_ids.is_cuda and sample.tile_mask.is_cuda
    image = render if sample.view == 0 else render[:32, :32]
    target = gt if sample.view == 0 else gt[:32, :32]
    cuda_render = image.cuda().requires_grad_(True)
    loss, tile_errors = TileLoss()(cuda_render, target.cuda(), sample.tile_ids)
    loss.backward()
    twin_loss, twin_errors = TileLoss()(image, target, sample.tile_ids.cpu())
    torch.testing.assert_close(loss.detach().cpu(), twin_loss.detach(), rtol=1e-5, atol=1e-6)
    memory.update(sample.view, sample.tile_ids, tile_errors)
    torch.testing.assert_close(
        memory.errors[sample.view, sample.tile_ids].cpu(), twin_errors, rtol=1e-5, atol=1e-6
    )
