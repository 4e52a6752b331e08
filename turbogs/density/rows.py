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

from turbogs import host_read
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
    return grow(gaussians, optimizers, _all_rows(gaussians), clones=torch.nonzero(mask).squeeze(1), extra=extra)


def split(gaussians: Gaussians, optimizers: Optimizers, mask: torch.Tensor, n: int = 2,
          extra: Extra = None, generator: Optional[torch.Generator] = None) -> Dict[str, torch.Tensor]:
    """INRIA's split: replace every masked Gaussian by `n` children (see `split_children`).
    Parents are removed, children are appended after the unselected Gaussians."""
    _check_mask(mask, len(gaussians), "mask")
    if n < 1:
        raise ValueError(f"split needs n >= 1 children, got {n}")
    return grow(gaussians, optimizers, torch.nonzero(~mask).squeeze(1), parents=torch.nonzero(mask).squeeze(1),
                n=n, extra=extra, generator=generator)


# --- densification in one rebuild, with no host read ----------------------------------


@torch.no_grad()
def grow(gaussians: Gaussians, optimizers: Optimizers, kept: torch.Tensor, clones: Optional[torch.Tensor] = None,
         parents: Optional[torch.Tensor] = None, n: int = 2, new_kept: Optional[torch.Tensor] = None,
         extra: Extra = None, generator: Optional[torch.Generator] = None) -> Dict[str, torch.Tensor]:
    """Keep rows `kept`, then append a copy of each row in `clones`, then the `n` children of
    each row in `parents` (`split_children`: n blocks, each in the parents' order), keeping
    of those new rows only the positions `new_kept` (None: all). All are index tensors into
    the current rows, so nothing is read from the device: a densification's clone, split and
    prune in one rebuild, the same rows in the same order as `duplicate`, `split` and
    `remove_rows` one after another (the new rows' prune test only needs their values,
    which are known before they exist)."""
    pieces = []
    if clones is not None:
        pieces.append({name: gaussians.params[name].detach().index_select(0, clones) for name in PARAM_NAMES})
    if parents is not None:
        chosen = {name: gaussians.params[name].detach().index_select(0, parents) for name in PARAM_NAMES}
        pieces.append(split_children(chosen, n, generator))
    new_rows = {name: torch.cat([piece[name] for piece in pieces]) for name in PARAM_NAMES} if pieces else None
    if new_rows is not None and new_kept is not None:
        new_rows = {name: value.index_select(0, new_kept) for name, value in new_rows.items()}
    return rebuild_rows(gaussians, optimizers, kept, new_rows, extra)


def split_children(parents: Mapping[str, torch.Tensor], n: int,
                   generator: Optional[torch.Generator] = None) -> Dict[str, torch.Tensor]:
    """The `n` children of each parent row (n blocks, each in the parents' order).

    Each child's mean is a sample of the parent's own distribution N(mean, R S^2 R^T);
    its scales are the parent's divided by 0.8 * n (so 1.6 for n = 2), which keeps the
    children inside the parent's footprint (`child_log_scales`); every other parameter is
    copied."""
    children = {name: value.repeat((n,) + (1,) * (value.dim() - 1)) for name, value in parents.items()}
    scales = torch.exp(children["scales"])
    sample_device = scales.device if generator is None else generator.device
    unit = torch.randn(scales.shape, generator=generator, device=sample_device).to(scales.device)
    rotation = quat_to_rotmat(children["quats"])
    children["means"] = children["means"] + torch.einsum("nij,nj->ni", rotation, unit * scales)
    children["scales"] = child_log_scales(children["scales"], n)
    return children


def child_log_scales(log_scales: torch.Tensor, n: int) -> torch.Tensor:
    """A split child's log-scales: the parent's divided by 0.8 * n."""
    return log_scales - math.log(0.8 * n)


def mask_index(mask: torch.Tensor, count: int) -> torch.Tensor:
    """The positions where the [N] bool `mask` is True, ascending: `nonzero(mask)` with its
    size `count` known to the host (read with others in one batch), so no read here. Each True
    row scatters its position to its rank; the False rows go to one spare slot, dropped."""
    rank = torch.cumsum(mask, 0) - 1
    slot = torch.where(mask, rank, torch.full_like(rank, count))
    index = torch.zeros(count + 1, dtype=torch.long, device=mask.device)
    index.scatter_(0, slot, torch.arange(mask.numel(), device=mask.device))
    return index[:count]


def read_counts(**masks: torch.Tensor) -> Dict[str, int]:
    """The number of True entries of each mask (or the value of each 0-d count), in one host
    read: what a densification needs to know on the host, its sizes."""
    names = list(masks)
    counts = host_read.values(torch.stack([(value.sum() if value.dim() else value).long() for value in masks.values()]))
    return {name: int(count) for name, count in zip(names, counts)}


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


@torch.no_grad()
def set_rows(gaussians: Gaussians, optimizers: Optimizers, mask: torch.Tensor, values: Mapping[str, torch.Tensor],
             extra: Extra = None) -> None:
    """Overwrite the masked rows of some parameters (`values`: full [N, ...] tensors, read at
    the masked rows only) and zero those rows' optimizer state in every optimizer, and their
    `extra` rows: a Gaussian moved or re-shaped in place (3DGS-MCMC's relocation) starts a new
    trajectory, as an appended row does, while the other rows keep theirs exactly. Rows do
    not change; masked arithmetic, no host read."""
    n = len(gaussians)
    _check_mask(mask, n, "mask")
    _check_extra(extra, n)
    for name, value in values.items():
        param = gaussians.params[name]
        if value.shape != param.shape:
            raise ValueError(f"new values for '{name}' have shape {tuple(value.shape)}, expected {tuple(param.shape)}")
    for name, value in values.items():
        param = gaussians.params[name]
        param.copy_(torch.where(_rows_of(mask, param), value.to(param), param))
    for name, optimizer in optimizers.items():
        _check_bound(optimizer, name, gaussians)
        for value in optimizer.state.get(gaussians.params[name], {}).values():
            if torch.is_tensor(value) and value.dim() >= 1 and value.shape[0] == n:
                value.masked_fill_(_rows_of(mask, value), 0)
    for value in (extra or {}).values():
        value.masked_fill_(_rows_of(mask, value), 0)


def _rows_of(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The [N] row mask shaped to broadcast over `like`'s [N, ...]."""
    return mask.to(like.device).reshape((-1,) + (1,) * (like.dim() - 1))
