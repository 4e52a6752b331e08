"""The optimizer as a setting: which one, how it is built per parameter, how it steps.

`TrainConfig.optimizer` holds one of these configs; the trainer calls its hooks and knows
no optimizer by name:

    optimizers = cfg.optimizer.build(params, rates)      # one per parameter, as INRIA's groups
    curvature = cfg.optimizer.estimate_curvature(...) if cfg.optimizer.wants_curvature(step) else None
    loss.backward()
    cfg.optimizer.step(optimizers, visible, curvature, ok)   # step (unless ok is False) and zero the gradients

One optimizer per parameter so that density control can edit each one's rows
(turbogs/density/rows.py). Adam lives here; the hybrid optimizer's config is
`turbogs.optim.HybridConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, Mapping, Optional

import torch
from torch import Tensor

Optimizers = Dict[str, torch.optim.Optimizer]


def clear_grads(optimizer: torch.optim.Optimizer) -> None:
    """`optimizer.zero_grad(set_to_none=True)` without its profiler record, which costs two ops
    per optimizer per step (counted by the step audit) and records nothing unless profiling."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            param.grad = None


class OptimizerConfig:
    """Base of the optimizer settings (each a dataclass). `name` is what --optimizer takes."""

    name: ClassVar[str]

    def build(self, params: Mapping[str, Tensor], rates: Mapping[str, float]) -> Optimizers:
        """One optimizer per parameter, in the order of `params`, at its learning rate."""
        raise NotImplementedError

    def wants_curvature(self, step: int) -> bool:
        """Whether this (0-based) step should estimate curvature before its backward pass."""
        return False

    def estimate_curvature(self, rendered: Tensor, params: Mapping[str, Tensor],
                           generator: torch.Generator) -> Optional[Dict[str, Tensor]]:
        """Curvature estimates from the rendered pixels (before backward), per parameter."""
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
        for optimizer in optimizers.values():
            if found_inf is not None:
                optimizer.found_inf = found_inf  # read by torch's Adam.step, passed to the fused kernel
            if not skip:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)


@dataclass
class AdamConfig(OptimizerConfig):
    """Adam with INRIA's epsilon (gradients of faint Gaussians are tiny)."""

    name: ClassVar[str] = "adam"
    eps: float = 1e-15
    # torch's fused kernel (CPU and CUDA): one op per parameter, and its step counter stays on
    # the device. The default (foreach) Adam reads each counter back to the host every step.
    # It rounds the last bits differently (tests/test_refactor_identity.py gives the tolerance).
    fused: bool = True

    def build(self, params: Mapping[str, Tensor], rates: Mapping[str, float]) -> Optimizers:
        return {name: torch.optim.Adam([param], lr=rates[name], eps=self.eps, fused=self.fused or None)
                for name, param in params.items()}
