"""The CUDA kernels of turbogs._C behind the signatures of their twins in `turbo_torch`.

`turbogs._C` comes from setup.py, or is compiled just in time from cuda/ on first use
(cuda/build.py). `require()` loads it or raises a one-line TurboGSError: on CUDA a missing
kernel is an error, never a silent fallback to the twins (see turbogs.kernels). Sampling: the kernels compute the Gumbel keys; the caller
takes argmax / torch.topk of them, exactly as on the twin path.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path

import torch

from turbogs.errors import TurboGSError

_PACKAGE = Path(__file__).resolve().parents[1]  # turbogs/


def build_script() -> Path:
    """cuda/build.py: shipped as package data (turbogs/cuda/) in an installed TurboGS, at the
    top of the repository in a source checkout."""
    for candidate in (_PACKAGE / "cuda" / "build.py", _PACKAGE.parent / "cuda" / "build.py"):
        if candidate.is_file():
            return candidate
    return _PACKAGE / "cuda" / "build.py"


def build_module():
    """cuda/build.py loaded as a module (it is package data, not a package): its `load_jit`
    builds turbogs._C, its `load_cpu_jit` the CPU kernels (turbogs/kernels/raster_cpu.py)."""
    spec = importlib.util.spec_from_file_location("turbogs_cuda_build", build_script())
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return build


@lru_cache(maxsize=None)
def _module():
    try:
        from turbogs import _C  # built by setup.py

        return _C
    except ImportError:
        pass
    script = build_script()
    if not script.is_file():
        raise ImportError(f"turbogs._C is not installed and {script} is missing")
    return build_module().load_jit()


def require() -> None:
    """Load turbogs._C (compiling it on first use), or raise one line that says what failed
    and how to go on. Cached: later calls cost a dictionary look-up."""
    try:
        _module()
    except Exception as exc:  # a compiler error, a missing toolkit, an ABI mismatch: all fatal here
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TurboGSError(
            f"TurboGS's CUDA kernels (turbogs._C) could not be built or loaded: {first_line}. "
            "Check the CUDA toolkit (nvcc) matches torch's CUDA, or run with --torch-twins (slower)"
        ) from None


def available() -> bool:
    """True when the kernels can run here (a CUDA torch, and turbogs._C built or buildable)."""
    if not torch.cuda.is_available():
        return False
    try:
        require()
        return True
    except TurboGSError:
        return False


# --- error memory and sampling --------------------------------------------------------


def memory_update(errors, view, num_tiles, tile_ids, tile_errors, decay):
    if torch.is_tensor(view):  # an index on the device: update a copy of its row, written back (no read)
        index = view.reshape(1)
        row = errors.index_select(0, index).contiguous()
        memory_update(row, 0, num_tiles, tile_ids, tile_errors, decay)
        errors.index_copy_(0, index, row)
        return
    _module().memory_update(
        errors, int(view), int(num_tiles), tile_ids.contiguous(), tile_errors.detach().float().contiguous(),
        float(decay),
    )


def view_sample_keys(errors, tile_counts, view_floor, uniforms):
    return _module().view_sample_keys(
        errors, tile_counts.contiguous(), float(view_floor), uniforms.float().contiguous()
    )


def tile_sample_keys(errors_row, gamma, tile_floor, uniforms):
    return _module().tile_sample_keys(
        errors_row.contiguous(), float(gamma), float(tile_floor), uniforms.float().contiguous()
    )


# --- tile loss -------------------------------------------------------------------------


def _param_args(params):
    return (
        int(params.tile_size), int(params.ssim_patch), int(params.ncc_patch),
        float(params.lambda_ssim), float(params.lambda_ncc), float(params.ncc_eps), float(params.ncc_std_ref),
        float(params.ssim_c1), float(params.ssim_c2),
    )


class _TileLossFunction(torch.autograd.Function):
    """Forward: per-tile losses from the fused kernel, reduced like the twin. Backward:
    the fused backward kernel (statistics recomputed, nothing stored per pixel). `module`:
    turbogs._C on CUDA, the CPU kernels (turbo_cpu) on the CPU; both bind the same two functions."""

    @staticmethod
    def forward(ctx, module, render, gt, tile_ids, mask, params):
        args = _param_args(params)
        tile_loss, tile_weight = module.tile_loss_forward(render, gt, mask, tile_ids, *args)
        # sum(N_i L_i) / sum(N), and 0 when no pixel counted (then every N_i L_i is 0 too): the
        # twin's safe division in four launches.
        total = tile_weight.sum().clamp_min(torch.finfo(render.dtype).tiny)
        loss = torch.dot(tile_weight, tile_loss) / total
        ctx.save_for_backward(render, gt, tile_ids, mask, tile_weight, total)
        ctx.module, ctx.args = module, args
        ctx.mark_non_differentiable(tile_loss)
        return loss, tile_loss

    @staticmethod
    def backward(ctx, grad_loss, _grad_tile_loss):
        render, gt, tile_ids, mask, tile_weight, total = ctx.saved_tensors
        # dLoss/dL_i = N_i / sum(N): the weighted mean of the forward pass.
        tile_scale = tile_weight * (grad_loss / total)
        grad_render = ctx.module.tile_loss_backward(render, gt, mask, tile_ids, tile_scale.contiguous(), *ctx.args)
        return None, grad_render, None, None, None, None


def fused_tile_loss(module, render, gt, tile_ids, mask, params):
    """The twin's (loss, tile_errors) from `module`'s fused forward and backward kernels; the
    tile errors need no gradient (marked so), the ground truth and mask none (not detached
    again: every launch counts on CUDA)."""
    render = render.contiguous()
    gt = (gt.detach() if gt.requires_grad else gt).to(render.dtype).contiguous()
    mask = None if mask is None else (mask.detach() if mask.requires_grad else mask).to(render.dtype).contiguous()
    return _TileLossFunction.apply(module, render, gt, tile_ids.contiguous(), mask, params)


def tile_loss(render, gt, tile_ids, mask, params):
    return fused_tile_loss(_module(), render, gt, tile_ids, mask, params)
