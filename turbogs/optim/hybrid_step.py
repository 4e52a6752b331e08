"""The hybrid optimizer's update, for one optimizer or all of them at once, in torch's `_foreach` ops.

The trainer keeps one HybridOptimizer per parameter (so that density control can edit each one's
rows), and a step of each one alone is ~35 small ops: ~230 per training step for the six
parameters, where the GPU spends more time launching kernels than running them. So the update is
written once, as one `_foreach` op per stage over a list of parameters: `HybridOptimizer.step`
passes its own, `foreach_step` every optimizer's, and the arithmetic is the same either way.
Only what differs per parameter stays per parameter: the curvature term of the parameters that
have one (`HybridOptimizer._denominator`), the options that work row by row (per-row bias
correction, a step clip, visible rows) and the `torch.where` that zeroes a non-finite step's
gradients (its `ok`, 0 there, then weighs every change). The rule itself, and why, is in hybrid.py's docstring.
"""

from __future__ import annotations

from itertools import groupby
from typing import List, Optional, Sequence

import torch


def per_row(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A [N] tensor viewed so that it broadcasts over the rows of `like` ([N, ...])."""
    return values.view((-1,) + (1,) * (like.dim() - 1))


def rows_and_ok(rows: Optional[torch.Tensor], ok: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The rows to update: `rows` ([N] bool or None = all) and the step's `ok` (0-d bool or None)."""
    if ok is None:
        return rows
    return ok.reshape(1) if rows is None else rows & ok


def assign(target: torch.Tensor, value: torch.Tensor, rows: Optional[torch.Tensor]) -> None:
    """target <- value, on the selected rows only (all rows when `rows` is None)."""
    if rows is None:
        target.copy_(value)
    else:
        target.copy_(torch.where(per_row(rows, target), value, target))


def foreach_step(optimizers: Sequence[torch.optim.Optimizer], visible: Optional[torch.Tensor],
                 ok: Optional[torch.Tensor] = None) -> None:
    """Step every HybridOptimizer in `optimizers` together. `visible` ([N] bool, or None for all
    rows) and `ok` (a 0-d device bool; where False nothing changes, with no host read) as
    HybridOptimizer.step."""
    update([entry for optimizer in optimizers for entry in optimizer.entries()], visible, ok)


@torch.no_grad()
def update(entries: List[tuple], visible: Optional[torch.Tensor], ok: Optional[torch.Tensor]) -> None:
    """One hybrid step of every (optimizer, group, param) in `entries` with a gradient, one
    _foreach op per stage over the parameters that share Adam's betas and eps, dtype and device."""
    def shared(entry):
        _, group, param = entry
        return group["betas"], group["eps"], param.dtype, str(param.device)

    for _, batch in groupby(sorted(entries, key=lambda e: str(shared(e))), key=lambda e: str(shared(e))):
        _update_batch(list(batch), visible, ok)


def _update_batch(entries: List[tuple], visible: Optional[torch.Tensor], ok: Optional[torch.Tensor]) -> None:
    params = [param for _, _, param in entries]
    grads = [param.grad for param in params]
    states = [optimizer._state(param) for optimizer, _, param in entries]
    groups = [group for _, group, _ in entries]
    # The rows each parameter updates: all of them, masked by `ok` alone (0-d), or the visible ones.
    rows = None if visible is None else [rows_and_ok(optimizer.rows_mask(visible, param), ok)
                                          for optimizer, _, param in entries]
    beta1, beta2 = groups[0]["betas"]
    eps, dtype = groups[0]["eps"], params[0].dtype
    steps = [state["step"] for state in states]
    count = len(params)

    # Step counters: each row's and each optimizer's (float64, on the device), +1 where updated.
    # (Lists of the flags, not a flag alone: _foreach_add_(list, tensor) reads it on the CPU.)
    row_steps = [state["row_step"] for state in states]
    if ok is None:
        torch._foreach_add_(steps, 1)
    else:
        torch._foreach_add_(steps, [ok.to(steps[0].dtype)] * len(states))
    if rows is not None:
        torch._foreach_add_(row_steps, [r.to(dtype) for r in rows])
    elif ok is not None:
        torch._foreach_add_(row_steps, [ok.to(dtype)] * len(states))
    else:
        torch._foreach_add_(row_steps, 1)

    # Every row updated (no visible rows): the moments and parameters change in place, and `ok`
    # enters as a 0/1 weight on each change (a skipped step's gradients zeroed first, so that its
    # NaNs touch nothing): one pass per parameter where masking the new values costs six.
    # Visible rows only: the new values are made beside the old, and masked.
    in_place = rows is None
    exp_avgs, exp_avg_sqs = [state["exp_avg"] for state in states], [state["exp_avg_sq"] for state in states]
    if in_place:
        weight, decay = 1 - beta1, beta2
        if ok is not None:
            keep = ok.to(dtype)
            grads = [torch.where(ok, grad, 0.0) for grad in grads]
            weight, decay = [keep * (1 - beta1)] * count, [1 - keep * (1 - beta2)] * count
        torch._foreach_lerp_(exp_avgs, grads, weight)
        torch._foreach_mul_(exp_avg_sqs, decay)
    else:
        exp_avgs = torch._foreach_lerp(exp_avgs, grads, 1 - beta1)
        exp_avg_sqs = torch._foreach_mul(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)

    # Bias corrections 1 - beta^t, in float64 as torch's Adam: of every optimizer's step count
    # (the powers one by one, the rest on one stacked vector), or of each row's own.
    powers = torch.stack(torch._foreach_pow(beta1, steps) + torch._foreach_pow(beta2, steps))
    corrections = 1 - powers
    bias1 = list(corrections[:count].to(dtype).unbind())
    bias2_root = list(corrections[count:].sqrt().to(dtype).unbind())
    for i, (group, state, param) in enumerate(zip(groups, states, params)):
        if group["row_bias_correction"]:
            t = per_row(state["row_step"].clamp_min(1).double(), param)
            bias1[i], bias2_root[i] = (1 - beta1 ** t).to(dtype), (1 - beta2 ** t).sqrt().to(dtype)

    denominators = torch._foreach_sqrt(exp_avg_sqs)  # sqrt(v_hat), then the curvature where there is one
    torch._foreach_div_(denominators, bias2_root)
    denominators = [optimizer._denominator(state, group, param, adam)
                    for (optimizer, group, param), state, adam in zip(entries, states, denominators)]
    torch._foreach_add_(denominators, eps)
    ratios = torch._foreach_div(exp_avgs, denominators)  # m / P; the step is lr * ratio / bias1
    for group, ratio, b1 in zip(groups, ratios, bias1):
        if group["clip"] is not None:
            ratio.clamp_(-group["clip"] * b1, group["clip"] * b1)  # |step| <= clip * lr
    step_sizes = torch._foreach_reciprocal(bias1)  # lr / bias1, as `lr / tensor` computes it
    torch._foreach_mul_(step_sizes, [group["lr"] for group in groups])
    if in_place:
        if ok is not None:  # 0-d where, not a product: a first step skipped has lr / 0 here
            step_sizes = [torch.where(ok, size, 0.0) for size in step_sizes]
        torch._foreach_addcmul_(params, step_sizes, ratios, value=-1)
        return
    updated = torch._foreach_addcmul(params, step_sizes, ratios, value=-1)

    for targets, values in ((params, updated), ([state["exp_avg"] for state in states], exp_avgs),
                            ([state["exp_avg_sq"] for state in states], exp_avg_sqs)):
        # only the rows updated (`ok` is in them), masked on the device: no read
        values = [torch.where(per_row(r, value), value, target) for value, target, r in zip(values, targets, rows)]
        torch._foreach_copy_(targets, values)
