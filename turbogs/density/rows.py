"""Row operations: the only way to change *which* Gaussians exist.

A Gaussian is one row in every parameter tensor, and also one row in every piece of
per-Gaussian state kept elsewhere: Adam's `exp_avg` / `exp_avg_sq`, a density
strategy's gradient accumulators, a future optimizer's curvature estimate, and so on.
If any of these falls out of step with the parameters, training silently mixes up
Gaussians (or crashes on a shape error many steps later). So the rule is:

    Every change to the set of Gaussians goes through a function in this module, and
    every per-row tensor that lives outside the optimizers is passed to it as `extra`.

Each function
- rebuilds every parameter as `cat([old[kept rows], new rows])`, swaps the new tensors
  into `gaussians` with `Gaussians.replace`, and rebinds each optimizer's single param
  group to the new `Parameter` (its state moves to the new key);
- keeps the optimizer state of kept rows exactly, gives new rows zero moments (what
  INRIA does: a new Gaussian has no gradient history), and keeps scalar state such as
  Adam's `step`;
- carries `.grad` the same way (new rows get zero gradient), so an optimizer step taken
  right after a row operation still updates the kept rows;
- returns `extra` with the same rule: kept rows keep their values, new rows are zeros.

The optimizers are a dict name -> optimizer with one param group holding
`gaussians.params[name]`; names without an optimizer (a frozen parameter) are allowed.
"""

from __future__ import annotations

import math
from typing import Dict, Mapping, Optional

import torch

from turbogs.gaussians import PARAM_NAMES, Gaussians
from turbogs.kernels.projection_torch import quat_to_rotmat

Optimizers = Mapping[str, torch.optim.Optimizer]
Extra = Optional[Dict[str, torch.Tensor]]


# --- the one primitive --------------------------------------------------------------


@torch.no_grad()
def rebuild_rows(
    gaussians: Gaussians,
    optimizers: Optimizers,
    kept: torch.Tensor,
    new_params: Optional[Mapping[str, torch.Tensor]] = None,
    extra: Extra = None,
) -> Dict[str, torch.Tensor]:
    """Make the rows `old[kept]` followed by `new_params`; every public op is this.

    `kept` is a 1-D index tensor into the current rows (order and repeats allowed).
    Returns the updated `extra` (an empty dict when none was given).
    """
    n_old = len(gaussians)
    kept = kept.to(device=gaussians.means.device, dtype=torch.long)
    n_new = 0 if new_params is None else _count_new_rows(new_params)
    _check_extra(extra, n_old)
    for name, optimizer in optimizers.items():  # check everything before changing anything
        _check_bound(optimizer, name, gaussians)

    def remap(old: torch.Tensor) -> torch.Tensor:
        rows = old.index_select(0, kept.to(old.device))
        pad = old.new_zeros((n_new,) + tuple(old.shape[1:]))
        return torch.cat([rows, pad]) if n_new else rows

    rebuilt = {}
    for name in PARAM_NAMES:
        old = gaussians.params[name]
        rows = old.detach().index_select(0, kept)
        if n_new:
            added = new_params[name].to(device=old.device, dtype=old.dtype)
            if added.shape[1:] != old.shape[1:]:
                raise ValueError(f"new rows for '{name}' have shape {tuple(added.shape)}, expected [*, {list(old.shape[1:])}]")
            rows = torch.cat([rows, added])
        rebuilt[name] = rows

    old_params = {name: gaussians.params[name] for name in PARAM_NAMES}
    gaussians.replace(rebuilt)
    for name, old in old_params.items():
        new = gaussians.params[name]
        new.requires_grad_(old.requires_grad)
        if old.grad is not None:
            new.grad = remap(old.grad)
        if name in optimizers:
            _rebind(optimizers[name], old, new, remap, n_old)

    return {key: remap(value) for key, value in (extra or {}).items()}


def _check_bound(optimizer, name: str, gaussians: Gaussians) -> None:
    """The optimizer for `name` must hold exactly `gaussians.params[name]`."""
    if name not in PARAM_NAMES:
        raise ValueError(f"optimizer '{name}' has no matching Gaussian parameter (known: {', '.join(PARAM_NAMES)})")
    if len(optimizer.param_groups) != 1 or len(optimizer.param_groups[0]["params"]) != 1:
        raise RuntimeError(f"optimizer '{name}' must have exactly one param group with one parameter")
    if optimizer.param_groups[0]["params"][0] is not gaussians.params[name]:
        raise RuntimeError(
            f"optimizer '{name}' does not hold gaussians.params['{name}']: it went stale, so some row "
            "change bypassed turbogs.density.rows"
        )


def _rebind(optimizer, old, new, remap, n_old) -> None:
    """Point the optimizer at `new` and carry its per-row state through `remap`."""
    state = optimizer.state.pop(old, None)
    optimizer.param_groups[0]["params"] = [new]
    if state is not None:
        optimizer.state[new] = {key: _remap_state(value, remap, n_old) for key, value in state.items()}


def _remap_state(value, remap, n_old):
    """Per-row state (a tensor whose first dimension is the row count) follows the rows;
    anything else (Adam's scalar `step`, hyperparameters) is kept as it is."""
    if torch.is_tensor(value) and value.dim() >= 1 and value.shape[0] == n_old:
        return remap(value)
    return value


def _count_new_rows(new_params: Mapping[str, torch.Tensor]) -> int:
    missing = [name for name in PARAM_NAMES if name not in new_params]
    if missing:
        raise ValueError(f"new rows lack parameter(s) {', '.join(missing)}")
    counts = {name: new_params[name].shape[0] for name in PARAM_NAMES}
    if len(set(counts.values())) != 1:
        raise ValueError(f"new rows disagree on their count: {counts}")
    return next(iter(counts.values()))


def _check_extra(extra: Extra, n: int) -> None:
    for key, value in (extra or {}).items():
        if value.dim() < 1 or value.shape[0] != n:
            raise ValueError(f"extra state '{key}' has shape {tuple(value.shape)}, but there are {n} Gaussians")


def _check_mask(mask: torch.Tensor, n: int, what: str) -> torch.Tensor:
    if mask.dtype != torch.bool or mask.shape != (n,):
        raise ValueError(f"{what} must be a bool tensor of shape [{n}], got {mask.dtype} {tuple(mask.shape)}")
    return mask


def _all_rows(gaussians: Gaussians) -> torch.Tensor:
    return torch.arange(len(gaussians), device=gaussians.means.device)


# --- the public operations ----------------------------------------------------------


def append_rows(gaussians: Gaussians, optimizers: Optimizers, new_params: Mapping[str, torch.Tensor],
                extra: Extra = None) -> Dict[str, torch.Tensor]:
    """Add new Gaussians (pre-activation tensors for every parameter) after the old ones."""
    return rebuild_rows(gaussians, optimizers, _all_rows(gaussians), new_params, extra)


def remove_rows(gaussians: Gaussians, optimizers: Optimizers, keep_mask: torch.Tensor,
                extra: Extra = None) -> Dict[str, torch.Tensor]:
    """Keep only the rows where `keep_mask` is True, in their order."""
    _check_mask(keep_mask, len(gaussians), "keep_mask")
    return rebuild_rows(gaussians, optimizers, torch.nonzero(keep_mask).squeeze(1), None, extra)


def duplicate(gaussians: Gaussians, optimizers: Optimizers, mask: torch.Tensor,
              extra: Extra = None) -> Dict[str, torch.Tensor]:
    """INRIA's clone: append an exact copy of every masked Gaussian (the copy starts with
    zero optimizer moments; the gradient then pulls the two apart)."""
    _check_mask(mask, len(gaussians), "mask")
    copies = {name: gaussians.params[name].detach()[mask] for name in PARAM_NAMES}
    return append_rows(gaussians, optimizers, copies, extra)


@torch.no_grad()
def split(gaussians: Gaussians, optimizers: Optimizers, mask: torch.Tensor, n: int = 2,
          extra: Extra = None, generator: Optional[torch.Generator] = None) -> Dict[str, torch.Tensor]:
    """INRIA's split: replace every masked Gaussian by `n` children.

    Each child's mean is a sample of the parent's own distribution N(mean, R S^2 R^T);
    its scales are the parent's divided by 0.8 * n (so 1.6 for n = 2), which keeps the
    children inside the parent's footprint; every other parameter is copied. Parents are
    removed, children are appended after the unselected Gaussians.
    """
    _check_mask(mask, len(gaussians), "mask")
    if n < 1:
        raise ValueError(f"split needs n >= 1 children, got {n}")
    parents = {name: gaussians.params[name].detach()[mask] for name in PARAM_NAMES}
    children = {name: value.repeat((n,) + (1,) * (value.dim() - 1)) for name, value in parents.items()}

    scales = torch.exp(children["scales"])
    sample_device = scales.device if generator is None else generator.device
    unit = torch.randn(scales.shape, generator=generator, device=sample_device).to(scales.device)
    rotation = quat_to_rotmat(children["quats"])
    children["means"] = children["means"] + torch.einsum("nij,nj->ni", rotation, unit * scales)
    children["scales"] = children["scales"] - math.log(0.8 * n)

    return rebuild_rows(gaussians, optimizers, torch.nonzero(~mask).squeeze(1), children, extra)


@torch.no_grad()
def set_values(gaussians: Gaussians, optimizers: Optimizers, name: str, values: torch.Tensor) -> None:
    """Overwrite one parameter's values in place and zero its optimizer moments, because
    the old moments describe a trajectory the values no longer follow (INRIA's opacity
    reset). Rows are unchanged, so nothing else needs to follow; Adam's `step` is kept."""
    param = gaussians.params[name]
    if values.shape != param.shape:
        raise ValueError(f"new values for '{name}' have shape {tuple(values.shape)}, expected {tuple(param.shape)}")
    param.copy_(values)
    if name in optimizers:
        n = param.shape[0]
        for key, value in optimizers[name].state.get(param, {}).items():
            if torch.is_tensor(value) and value.dim() >= 1 and value.shape[0] == n:
                value.zero_()
