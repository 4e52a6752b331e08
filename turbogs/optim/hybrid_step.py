"""The hybrid optimizer's step for all parameters at once, in torch's `_foreach` ops.

The trainer keeps one HybridOptimizer per parameter (so density control can edit each one's
rows), and a step of each one alone is ~35 small ops: ~230 per training step for the six
parameters, where the GPU spends more time launching kernels than running them. Here the
same update runs as one `_foreach` op per stage over every parameter's tensors: the moments,
the bias corrections (of each optimizer's own step counter, on the device), the
preconditioner and the parameter update. Only what differs per parameter stays per
parameter: the curvature term of the parameters that have one (`HybridOptimizer._denominator`)
and the `torch.where` that keeps everything as it was on a non-finite step.

It is the arithmetic of `HybridOptimizer.step`, op for op, on the same values, so the result
is the same to the bit on the CPU (tests/test_hybrid_foreach.py; on CUDA the fused foreach
kernels may round a multiply-add differently in the last bit). Where the fast path does not
apply (selective steps, per-row bias correction, a step clip, mixed hyperparameters, dtypes
or devices) each optimizer takes its own step.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch


def foreach_step(optimizers: Sequence[torch.optim.Optimizer], visible: Optional[torch.Tensor],
                 ok: Optional[torch.Tensor] = None) -> None:
    """Step every HybridOptimizer in `optimizers`: all at once where possible, else each alone.
    `visible` restricts the update to rows (then each steps alone); `ok` as HybridOptimizer.step."""
    entries = _entries(optimizers)
    if visible is not None or entries is None:
        for optimizer in optimizers:
            optimizer.step(visible=visible, ok=ok)
        return
    if entries:
        _step_all(entries, ok)


def _entries(optimizers) -> Optional[List[tuple]]:
    """(optimizer, group, param) for every parameter with a gradient, or None when the
    foreach path does not apply to them."""
    entries = [(optimizer, group, param) for optimizer in optimizers for group in optimizer.param_groups
               for param in group["params"] if param.grad is not None]
    if not entries:
        return entries
    first_group, first_param = entries[0][1], entries[0][2]
    for _, group, param in entries:
        if group["row_bias_correction"] or group["clip"] is not None:
            return None
        if group["betas"] != first_group["betas"] or group["eps"] != first_group["eps"]:
            return None
        if param.dtype != first_param.dtype or param.device != first_param.device or param.grad.is_sparse:
            return None
    return entries


@torch.no_grad()
def _step_all(entries: List[tuple], ok: Optional[torch.Tensor]) -> None:
    """HybridOptimizer.step's arithmetic (its comments say why), one _foreach op per stage."""
    params = [param for _, _, param in entries]
    grads = [param.grad for param in params]
    states = [optimizer._state(param) for optimizer, _, param in entries]
    beta1, beta2 = entries[0][1]["betas"]
    eps, dtype = entries[0][1]["eps"], params[0].dtype
    steps = [state["step"] for state in states]

    # Step counters: each row's and each optimizer's (float64, on the device), +1 unless not ok.
    # (A list of the one flag, not the flag alone: _foreach_add_(list, tensor) reads it on the CPU.)
    row_steps = [state["row_step"] for state in states]
    if ok is None:
        torch._foreach_add_(row_steps, 1)
        torch._foreach_add_(steps, 1)
    else:
        torch._foreach_add_(row_steps, [ok.to(dtype)] * len(states))
        torch._foreach_add_(steps, [ok.to(steps[0].dtype)] * len(states))

    exp_avgs = torch._foreach_lerp([state["exp_avg"] for state in states], grads, 1 - beta1)
    exp_avg_sqs = torch._foreach_mul([state["exp_avg_sq"] for state in states], beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)

    # Bias corrections 1 - beta^t of every optimizer's t: the powers one by one (as the single
    # optimizer's), the rest (exactly rounded arithmetic) on one stacked vector.
    powers = torch.stack(torch._foreach_pow(beta1, steps) + torch._foreach_pow(beta2, steps))
    corrections = 1 - powers
    count = len(params)
    bias1 = corrections[:count].to(dtype).unbind()
    bias2_root = corrections[count:].sqrt().to(dtype).unbind()

    denominators = torch._foreach_sqrt(exp_avg_sqs)  # sqrt(v_hat), then the curvature where there is one
    torch._foreach_div_(denominators, bias2_root)
    denominators = [optimizer._denominator(state, group, param, adam)
                    for (optimizer, group, param), state, adam in zip(entries, states, denominators)]
    torch._foreach_add_(denominators, eps)
    ratios = torch._foreach_div(exp_avgs, denominators)
    step_sizes = torch._foreach_reciprocal(bias1)  # lr / bias1, as `lr / tensor` computes it
    torch._foreach_mul_(step_sizes, [group["lr"] for _, group, _ in entries])
    updated = torch._foreach_addcmul(params, step_sizes, ratios, value=-1)

    for targets, values in ((params, updated), ([state["exp_avg"] for state in states], exp_avgs),
                            ([state["exp_avg_sq"] for state in states], exp_avg_sqs)):
        if ok is not None:  # a non-finite step keeps every value: masked on the device, no read
            values = [torch.where(ok, value, target) for value, target in zip(values, targets)]
        torch._foreach_copy_(targets, values)
