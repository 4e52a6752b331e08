"""The optimizer as a setting: which one, how it is built per parameter, how it steps.

`TrainConfig.optimizer` holds one of these configs; the trainer calls its hooks and knows
no optimizer by name:

    optimizers = cfg.optimizer.build(params, rates)      # one per parameter, as INRIA's groups
    curvature = cfg.optimizer.estimate_curvature(...) if cfg.optimizer.wants_curvature(step) else None
    loss.backward()
    cfg.optimizer.step(optimizers, visible, curvature, ok)   # step (unless ok is False) and zero the gradients

One optimizer per parameter so that density control can edit each one's rows
(turbogs/density/rows.py). Adam lives here; the hybrid optimizer's config is
`turbogs.optim.hybrid.HybridConfig`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Dict, Mapping, Optional, Tuple

import torch
from torch import Tensor

Optimizers = Dict[str, torch.optim.Optimizer]


def clear_grads(optimizer: torch.optim.Optimizer) -> None:
    """`optimizer.zero_grad(set_to_none=True)` without its profiler record, which costs two ops
    per optimizer per step (counted by the step audit) and records nothing unless profiling."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            param.grad = None


def load_keeping_settings(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """`optimizer.load_state_dict(state)` (the moments), keeping this run's settings (learning
    rates, betas, eps) instead of the saved ones: a run resumed on another number of views per
    step sets them differently (TrainConfig.for_views_per_step), and torch's load would bring
    back the old run's."""
    settings = [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, ours in zip(optimizer.param_groups, settings):
        group.update(ours)


class OptimizerConfig:
    """Base of the optimizer settings (each a dataclass). `name` is what --optimizer takes.
    Every optimizer here is Adam at heart: its settings have `betas` and `eps`."""

    name: ClassVar[str]
    # Other moving-average decays, per step, that per_views() counts in views (e.g. a curvature EMA).
    view_decays: ClassVar[Tuple[str, ...]] = ()

    def per_views(self, views: int) -> "OptimizerConfig":
        """These settings for steps whose gradient is the mean of `views` views, as Grendel-GS
        sets Adam for its batches (with the rates x sqrt(views), which the trainer sets): every
        moving average keeps its memory in views, not steps (a decay b becomes b^views: Adam's
        moments, and `view_decays`), and eps shrinks by sqrt(views) as the rates grow, so that
        the step keeps its shape where the gradient is tiny. Why: with the decays per step, a
        step of 2 views remembers twice as many views, and the averages lag twice as far behind
        the moving parameters."""
        if views == 1:
            return self
        changes = {name: getattr(self, name) ** views for name in self.view_decays}
        return dataclasses.replace(self, betas=tuple(beta ** views for beta in self.betas),
                                   eps=self.eps / views ** 0.5, **changes)

    def build(self, params: Mapping[str, Tensor], rates: Mapping[str, float]) -> Optimizers:
        """One optimizer per parameter, in the order of `params`, at its learning rate."""
        raise NotImplementedError

    def wants_curvature(self, step: int) -> bool:
        """Whether this (0-based) step should estimate curvature before its backward pass."""
        return False

    def estimate_curvature(self, rendered: Tensor, alpha: Tensor, params: Mapping[str, Tensor],
                           generator: torch.Generator) -> Optional[Dict[str, Tensor]]:
        """Curvature estimates from the rendered pixels ([M, 3], and their accumulated opacity
        [M, 1]; before backward), per parameter."""
        return None

    def step(self, optimizers: Optimizers, visible: Tensor, curvature: Optional[Dict[str, Tensor]],
             ok: Optional[Tensor] = None) -> None:
        """Step every optimizer and clear its gradients. `visible` [N]: the rendered rows.
        `ok`: a device bool; where False (a non-finite step) nothing changes.

        Fused Adam takes `ok` as its `found_inf` and skips the update on the device, with no
        read (as under a GradScaler); any other optimizer reads `ok` (one host read)."""
        fused = all(o.defaults.get("fused") for o in optimizers.values())
        skip = ok is not None and not fused and not bool(ok)
        found_inf = None if ok is None or not fused else (~ok).to(torch.float32)
        if fused and fused_adam_step(list(optimizers.values()), found_inf):
            for optimizer in optimizers.values():
                clear_grads(optimizer)
            return
        for optimizer in optimizers.values():
            if found_inf is not None:
                optimizer.found_inf = found_inf  # read by torch's Adam.step, passed to the fused kernel
            if not skip:
                optimizer.step()
            clear_grads(optimizer)


@dataclass
class AdamConfig(OptimizerConfig):
    """Adam with INRIA's epsilon (gradients of faint Gaussians are tiny)."""

    name: ClassVar[str] = "adam"
    betas: Tuple[float, float] = (0.9, 0.999)  # torch's and INRIA's
    eps: float = 1e-15
    # torch's fused kernel (CPU and CUDA): one op per parameter, and its step counter stays on
    # the device. The default (foreach) Adam reads each counter back to the host every step.
    # It rounds the last bits differently from the foreach Adam (about 1e-7 relative per step).
    fused: bool = True

    def build(self, params: Mapping[str, Tensor], rates: Mapping[str, float]) -> Optimizers:
        return {name: torch.optim.Adam([param], lr=rates[name], betas=tuple(self.betas), eps=self.eps,
                                       fused=self.fused or None)
                for name, param in params.items()}


@torch.no_grad()
def fused_adam_step(optimizers, found_inf: Optional[Tensor]) -> bool:
    """What `step()` of each torch.optim.Adam(fused=True) in `optimizers` does (torch's
    `_fused_adam`: the same kernel with the same arguments, so the same bits), with every step
    counter advanced by one op for all, and without the per-call bookkeeping (a profiler
    record per optimizer). False, doing nothing, when an optimizer has no state yet (its first
    step, which creates it) or settings the kernel call here does not pass (amsgrad, AdamW)."""
    entries = []
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            if group.get("amsgrad") or group.get("decoupled_weight_decay") or torch.is_tensor(group["lr"]):
                return False
            for param in group["params"]:
                if param.grad is not None:
                    if not optimizer.state.get(param):
                        return False
                    entries.append((group, param, optimizer.state[param]))
    steps = [state["step"] for _, _, state in entries]
    if not entries or len({(p.device, p.dtype) for _, p, _ in entries}) != 1:
        return not entries
    torch._foreach_add_(steps, 1)
    for group, param, state in entries:
        torch._fused_adam_([param], [param.grad], [state["exp_avg"]], [state["exp_avg_sq"]], [], [state["step"]],
                           amsgrad=False, lr=group["lr"], beta1=group["betas"][0], beta2=group["betas"][1],
                           weight_decay=group["weight_decay"], eps=group["eps"], maximize=group["maximize"],
                           grad_scale=None, found_inf=found_inf)
    if found_inf is not None:  # a skipped step does not count
        torch._foreach_sub_(steps, [found_inf] * len(steps))
    return True
