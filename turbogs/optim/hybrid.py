"""The hybrid optimizer: Adam's moments with a Newton cap from a cheap curvature estimate.

Why
---
Adam moves every coordinate by about `lr` per step, whatever the loss's curvature.
In Gaussian splatting the curvature of different Gaussians and parameters differs by
orders of magnitude (a large opaque Gaussian against a faint one, opacity logits
against SH coefficients). Where the curvature is high, Adam's `lr`-sized step
overshoots the minimum along that coordinate and oscillates. Where it is low, a
smaller `lr` chosen to avoid that makes progress slow. A diagonal Newton step
`g / h` lands on the minimum of the local quadratic model whatever the curvature.
But `h` can only be estimated, and with sparse, noisy steps (a few tiles a step)
the gradient is noisy too. Adam's denominator sqrt(v) then measures the gradient's
*noise*, not the curvature, and a coordinate with high curvature but little noise
gets too long a step. The hybrid preconditions with the larger of the two scales:

    m_hat = m / (1 - beta1^t),  v_hat = v / (1 - beta2^t)      Adam's moments
    h_hat = h / (1 - hessian_beta^k)                           curvature EMA (k estimates so far)
    step  = lr * m_hat / (max(kappa * h_hat, sqrt(v_hat)) + eps)

so, per coordinate, |step| = min(Adam's step, (lr / kappa) * |m_hat| / h_hat): the
smaller of Adam's step and a fraction lr / kappa of a Newton step (with momentum).
`kappa` (`curvature_scale`, in the parameter's units) is the learning rate at which
the Newton branch would take full Newton steps. The default 3 * lr takes a third of
one, which steadies noisy steps. kappa = 0 turns the curvature off (pure Adam). A learning-rate
schedule scales both branches alike, since kappa stays fixed. The Newton branch governs
where sqrt(v_hat) / h_hat < kappa, that is, where the remaining distance that the
curvature predicts is short.

The max() is the damping. It works like Levenberg-Marquardt, with Adam's sqrt(v_hat) as a
per-coordinate floor under kappa * h_hat. So a curvature estimate that is too *small*
(noise, or a coordinate seen on few pixels) can never make the step longer than Adam's.
One that is too *large* only shortens it. An optional hard clip (`clip`, Sophia-G style)
also bounds |step| <= clip * lr.

Bias of the blend: the Newton branch divides by an *average* curvature, and
E[1/h_hat] >= 1/E[h_hat] (Jensen), so noise in `h_hat` lengthens Newton steps on
average. The Adam cap bounds how far this can go. With the EMA over ~1/(1-hessian_beta)
estimates, the relative noise of `h_hat` is about sqrt(2 (1-hessian_beta)/(1+hessian_beta)) or less
(see `gauss_newton_diagonal_sample`): about 20% at hessian_beta = 0.95.

Calibrated curvature, and longer steps (what the trainer uses)
--------------------------------------------------------------
In splatting the rule above does nothing: the curvature of the L1 + D-SSIM loss has no
known scale (the estimator uses an L2-like surrogate, see `gauss_newton_diagonal_sample`),
and at the default scale kappa * h_hat stays far below sqrt(v_hat) (medians 1e-6 to 6e-3 of
it over a turbo run), so Adam's step always wins. Two options make the curvature count:

- `calibration_quantile` q: after each estimate, kappa is recalibrated as the q-quantile of
  sqrt(v_hat) / h_hat over the coordinates that have both. The surrogate's scale cancels;
  the curvature says only which coordinates are *relatively* stiff. At q = 0.5 the median
  coordinate's Newton step has Adam's length, stiffer ones take shorter steps, softer ones
  longer.
- `max_lengthening` L: the floor becomes sqrt(v_hat) / L on rows with a curvature estimate,

      P = max(kappa * h_hat, sqrt(v_hat) / L)     (rows with no estimate yet: sqrt(v_hat))

  so a Newton step may be up to L times Adam's, never more. L = 1 is the rule above.
- `max_shortening` S: a ceiling S * sqrt(v_hat) on P, so a step is never shorter than 1/S of
  Adam's. With S = 1 (the trainer's) the curvature only lengthens: the soft coordinates (a
  Newton step longer than Adam's) go up to L times farther, the stiff ones take Adam's step.

Why only lengthen: measured on the step's own view and tiles, the loss is nearly linear over
one Adam step (a parabola through the step puts the minimum many steps out), so Adam's
steps are nowhere too long for the curvature; what limits them is the gradient's noise from
view to view, which Adam's sqrt(v_hat) already measures. Shortening stiff coordinates then
only slows them, and it cost more than lengthening gained (docs/RESULTS.md).

Why this can help where Adam already adapts: with an L1 loss every pixel's residual weight
has the same magnitude, so Adam's v_hat is itself a Gauss-Newton diagonal with unit
residuals (an empirical Fisher), and Adam's step ~ m / sqrt(h). The calibrated hybrid steps
~ m / h between its bounds: it moves the preconditioner's exponent from 1/2 to 1. For a
Gaussian's mean, h grows like 1/size^2, so Adam moves a tiny and a large Gaussian by the same
distance, and the hybrid moves each in proportion to its size. Measured on a real capture (the
figures are in docs/RESULTS.md), this pays for the means and costs for opacities, scales and
colours, so the trainer curves only the means (`HybridConfig.curvature_on`). With calibration, noise in h_hat reorders coordinates:
one whose curvature is overestimated steps shorter, one whose curvature is underestimated
steps longer, but never more than L times Adam's step.

Where it helps (tests/test_optim.py measures it): on an ill-conditioned quadratic with
noisy gradients (targets observed with noise, like one view or a few tiles per step),
it reaches a tolerance in 1.6-2.5x fewer steps than Adam at its best learning rate
(four problem seeds). On the noise-free quadratic the two tie: both are then limited by the momentum
(an EMA with beta1 contracts by at best sqrt(beta1) a step), and Adam's sqrt(v)
already tracks the curvature there.

Rows and visibility
-------------------
Every parameter is a stack of rows (one per Gaussian). All state but the optimizer's
`step` count is per row: `exp_avg`, `exp_avg_sq`, `hessian` (shaped like the parameter),
plus `row_step` and `hessian_count` ([N], the number of Adam steps and curvature
estimates each row has had, for bias correction). So:

- `step(visible)` updates only visible rows, like gsplat's SelectiveAdam: invisible
  rows keep their parameters, moments and counts. Bias correction counts the optimizer's
  steps, as in Adam and SelectiveAdam, by default. With `row_bias_correction` it counts
  each row's own steps instead: a visible row then follows exactly the path it would take
  under an optimizer that only ever saw it, and a Gaussian seen first at step 1000 takes
  an `lr`-sized first step, not one ~2.5x larger. That sounds cleaner but lost on the demo
  scene (more with selective updates), where the larger first steps of new Gaussians help,
  so it is off.
- A zero row is a fresh row. turbogs.density.rows gives new Gaussians zeros in every
  per-row state tensor, and `set_values` (opacity reset) zeros them: no moments, no
  curvature (and, with `row_bias_correction`, bias correction from step one).
- With no curvature estimate ever given (or curvature_scale = 0), the update is Adam's, term for
  term (torch.optim.Adam's formula; equal up to float rounding).

Expected call pattern (the trainer's)
-------------------------------------
::

    out = render(...)
    loss = loss_fn(out.image, gt)
    estimates = None
    if step % cfg.hessian_every == 0:
        estimates = gauss_newton_diagonal_sample(
            out.image, {n: gaussians.params[n] for n in optimizers}, generator,
            loss_hessian_scale=cfg.loss_hessian_scale * w)   # w: the loss's weight per pixel value,
                                                             # e.g. (1 - lambda_ssim) / out.image.numel()
    loss.backward()
    for name, optimizer in optimizers.items():
        optimizer.step(visible)                    # visible: bool [N], or None for all rows
        if estimates is not None:
            optimizer.update_hessian(estimates[name], visible)
        optimizer.zero_grad(set_to_none=True)

The estimator pass is one extra backward pass through the same graph, every
`hessian_every` steps: about 1/hessian_every of a backward pass's cost per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from turbogs.errors import TurboGSError
from turbogs.optim.base import AdamConfig, OptimizerConfig, Optimizers, clear_grads
from turbogs.optim.curvature import (calibration_quantile, colour_curvature_bound, gauss_newton_diagonal_sample,
                                     rademacher)
from turbogs.optim.hybrid_step import assign, foreach_step, per_row, rows_and_ok, update

__all__ = ["HybridConfig", "HybridOptimizer", "gauss_newton_diagonal_sample", "rademacher"]



@dataclass
class HybridConfig(OptimizerConfig):
    """Hyperparameters of the hybrid optimizer and of its estimator call, with the values
    recommended for Gaussian splatting. The learning rates themselves stay per parameter
    (INRIA's Adam rates; see the trainer's LearningRates)."""

    name: ClassVar[str] = "hybrid"
    view_decays: ClassVar[Tuple[str, ...]] = ("hessian_beta",)  # per_views: the curvature EMA remembers as many views
    betas: Tuple[float, float] = (0.9, 0.999)  # Adam's, as INRIA
    eps: float = 1e-15  # INRIA's; gradients of faint Gaussians are tiny
    hessian_beta: float = 0.95  # EMA of curvature estimates: ~20 estimates = 200 steps at hessian_every 10
    hessian_every: int = 10  # steps between curvature estimates (Sophia's k)
    # Which parameters take curvature-informed steps; the others take Adam's. Measured, the means
    # gain and every other group loses: a mean's curvature scales with 1/size^2, so the Newton step moves a Gaussian in proportion
    # to its size where Adam moves every mean by the same length. "sh0" (the colours) takes the
    # exact Gauss-Newton bound (curvature.colour_curvature_bound) instead of a sample.
    curvature_on: Tuple[str, ...] = ("means",)
    # The curvature's absolute scale is unknown (the surrogate below is a guess), so by default
    # it is calibrated: kappa puts the median coordinate's Newton step at Adam's length, the
    # softer ones longer (up to max_lengthening) and the stiffer ones shorter (down to Adam's step
    # over max_shortening). None: the fixed kappa below.
    calibration_quantile: Optional[float] = 0.5
    max_lengthening: float = 4.0  # a Newton step may be at most this many times Adam's
    max_shortening: float = 1.0  # ... and at least 1/this of it: 1, the curvature only lengthens
    newton_fraction: float = 1 / 3  # uncalibrated only: kappa = lr / newton_fraction
    clip: Optional[float] = None  # hard bound |step| <= clip * lr
    # Update only the Gaussians visible in the step (SelectiveAdam). Off: on the CPU it lost on
    # the demo (invisible Gaussians gliding on their momentum helps there); on a GPU it saves
    # the moment updates of invisible rows, a trade still to be measured.
    selective: bool = False
    # Bias-correct each row by its own step count (True) or, as Adam and gsplat's SelectiveAdam,
    # by the optimizer's (False). Per-row gives a new Gaussian an lr-sized first step instead of
    # Adam's ~2.5 lr; on the demo scene that lost (the larger first steps of new Gaussians help).
    row_bias_correction: bool = False
    # Curvature per unit of per-pixel loss weight. The L1 loss has no curvature, so a
    # Huber-like surrogate is used: curvature 1/delta, with delta ~ a typical residual.
    # Calibration cancels it; it matters only with calibration_quantile None.
    loss_hessian_scale: float = 10.0

    def __post_init__(self):
        if not self.newton_fraction > 0:
            raise TurboGSError(f"hybrid optimizer: newton_fraction must be > 0, got {self.newton_fraction}")
        if self.hessian_every < 1:
            raise TurboGSError(f"hybrid optimizer: hessian_every must be >= 1, got {self.hessian_every}")
        if not self.loss_hessian_scale >= 0:
            raise TurboGSError(f"hybrid optimizer: loss_hessian_scale must be >= 0, got {self.loss_hessian_scale}")

    def optimizer_kwargs(self, lr: float, curved: bool = True) -> dict:
        """Keyword arguments for `HybridOptimizer(params, **cfg.optimizer_kwargs(lr))`, with
        `lr` the parameter's initial learning rate (a schedule may change it later); with
        `curved` False, the optimizer takes Adam's steps (no curvature)."""
        return dict(lr=lr, betas=self.betas, eps=self.eps, hessian_beta=self.hessian_beta,
                    curvature_scale=lr / self.newton_fraction if curved else 0.0, clip=self.clip,
                    row_bias_correction=self.row_bias_correction, max_lengthening=self.max_lengthening,
                    max_shortening=self.max_shortening,
                    calibration_quantile=self.calibration_quantile if curved else None)

    # --- the optimizer hooks (turbogs/optim/base.py) --------------------------------------
    def build(self, params: Mapping[str, torch.Tensor], rates: Mapping[str, float]) -> Optimizers:
        """A HybridOptimizer for each curved parameter. The others take Adam's steps, so they get
        torch's fused Adam (one kernel a parameter, where the hybrid's arithmetic makes a dozen
        passes), unless `selective` asks for visible rows only, which only the hybrid does."""
        unknown = sorted(set(self.curvature_on) - set(params))
        if unknown:
            raise TurboGSError(f"hybrid.curvature_on names unknown parameter(s) {', '.join(unknown)} "
                               f"(choose from {', '.join(params)})")
        adam = AdamConfig(betas=self.betas, eps=self.eps)
        return {name: HybridOptimizer([param], **self.optimizer_kwargs(rates[name], curved=name in self.curvature_on))
                if name in self.curvature_on or self.selective else adam.build({name: param}, rates)[name]
                for name, param in params.items()}

    def wants_curvature(self, step: int) -> bool:
        return step % self.hessian_every == 0

    def estimate_curvature(self, rendered, alpha, params, generator):
        """For `curvature_on`: the colours' exact bound (colour_curvature_bound) and, for the
        other parameters, a Gauss-Newton diagonal sample over the rendered pixels."""
        scale = self.loss_hessian_scale / max(rendered.numel(), 1)
        sampled = {name: params[name] for name in self.curvature_on if name != "sh0"}
        estimates = gauss_newton_diagonal_sample(rendered, sampled, generator, loss_hessian_scale=scale) if sampled else {}
        if "sh0" in self.curvature_on:
            estimates["sh0"] = colour_curvature_bound(rendered, alpha, params["sh0"]) * scale
        return estimates

    def step(self, optimizers, visible, curvature, ok=None) -> None:
        hybrids = {name: o for name, o in optimizers.items() if isinstance(o, HybridOptimizer)}
        adams = {name: o for name, o in optimizers.items() if name not in hybrids}
        if adams:
            OptimizerConfig.step(self, adams, visible, None, ok)  # fused Adam's step, clears their gradients
        # Every hybrid's update at once, in a few _foreach ops (the arithmetic of HybridOptimizer.step).
        foreach_step(list(hybrids.values()), visible if self.selective else None, ok)
        for name, optimizer in hybrids.items():
            if curvature is not None and name in curvature:
                # Rendered rows only, even without selective steps: an unseen Gaussian's
                # zero estimate would dilute its curvature (measured: it lost on a real capture).
                optimizer.update_hessian(curvature[name], visible=visible, ok=ok)
            clear_grads(optimizer)


# --- the optimizer --------------------------------------------------------------------


class HybridOptimizer(torch.optim.Optimizer):
    """Adam with a per-coordinate Newton cap from a diagonal curvature EMA (see the module
    docstring for the rule, its damping and its bias). Parameters are stacks of rows
    (first dimension = number of Gaussians); `step` and `update_hessian` take an
    optional bool mask of the rows to update."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-15,
        hessian_beta: float = 0.95,
        curvature_scale: Optional[float] = None,
        clip: Optional[float] = None,
        row_bias_correction: bool = False,
        max_lengthening: float = 1.0,
        calibration_quantile: Optional[float] = None,
        max_shortening: float = math.inf,
    ):
        if curvature_scale is None:
            curvature_scale = 3.0 * lr  # a third of a Newton step where the curvature governs
        _check_hyperparameters(lr, betas, eps, hessian_beta, curvature_scale, clip, max_lengthening,
                               calibration_quantile, max_shortening)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, hessian_beta=hessian_beta,
                        curvature_scale=curvature_scale, clip=clip, row_bias_correction=row_bias_correction,
                        max_lengthening=max_lengthening, calibration_quantile=calibration_quantile,
                        max_shortening=max_shortening)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for param in group["params"]:
                if param.dim() < 1:
                    raise ValueError("HybridOptimizer needs parameters with a row dimension (dim >= 1)")

    def _state(self, param: torch.Tensor) -> dict:
        """Per-row state, created on first use; every entry has the row count first."""
        state = self.state[param]
        if not state:
            rows = param.shape[0]
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["hessian"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["row_step"] = torch.zeros(rows, dtype=param.dtype, device=param.device)
            state["hessian_count"] = torch.zeros(rows, dtype=param.dtype, device=param.device)
            state["step"] = torch.zeros((), dtype=torch.float64)
            # the calibrated curvature scale, if calibrating; on the device, so that no step reads it
            state["kappa"] = torch.zeros((), dtype=torch.float64, device=param.device)
        if state["step"].device != param.device:  # a checkpoint's CPU counter: counted on the device
            state["step"] = state["step"].to(param.device)
        return state

    @staticmethod
    def rows_mask(visible: Optional[torch.Tensor], param: torch.Tensor) -> Optional[torch.Tensor]:
        if visible is None:
            return None
        if visible.dtype != torch.bool or visible.shape != (param.shape[0],):
            raise ValueError(
                f"visible must be a bool tensor of shape [{param.shape[0]}], got {visible.dtype} {tuple(visible.shape)}"
            )
        return visible.to(param.device)

    def entries(self) -> List[tuple]:
        """(self, group, param) for every parameter with a gradient: what a step updates."""
        return [(self, group, param) for group in self.param_groups for param in group["params"]
                if param.grad is not None]

    def step(self, visible: Optional[torch.Tensor] = None, closure=None, ok: Optional[torch.Tensor] = None):
        """One update of every parameter with a gradient; `visible` restricts it to rows. `ok`: a
        0-d device bool; where False nothing changes (a non-finite step), with no host read.
        The arithmetic is hybrid_step.update, shared with the all-optimizers step."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        update(self.entries(), visible, ok)
        return loss

    def _denominator(self, state: dict, group: dict, param: torch.Tensor, adam: torch.Tensor) -> torch.Tensor:
        """The preconditioner P, from Adam's sqrt(v_hat): Adam's without curvature, else the
        hybrid's. A calibrated kappa stays a tensor (no host read): the hybrid denominator
        wherever it is positive, Adam's while it is 0 (no calibration yet)."""
        if group["calibration_quantile"] is not None:
            kappa = state["kappa"].to(param.device)
            return torch.where(kappa > 0, self._hybrid_denominator(state, group, param, adam, kappa), adam)
        if group["curvature_scale"] > 0:
            return self._hybrid_denominator(state, group, param, adam, group["curvature_scale"])
        return adam

    def _hybrid_denominator(self, state: dict, group: dict, param: torch.Tensor, adam: torch.Tensor,
                            kappa: Union[float, torch.Tensor]) -> torch.Tensor:
        """max(kappa * h_hat, sqrt(v_hat) / L), at most S * sqrt(v_hat), on rows with a curvature
        estimate; sqrt(v_hat) on the others (a row with no estimate yet must not be lengthened).
        From the cache that each estimate refreshes (`_refresh_curvature`): three or four passes."""
        if "curvature" not in state:  # a state saved before the cache existed
            self._refresh_curvature(state, group, param)
        floor = adam - adam * state["lengthening"] if group["max_lengthening"] > 1 else adam
        preconditioner = torch.maximum(floor, state["curvature"] * kappa)
        shortening = group.get("max_shortening", math.inf)  # a state saved before the option: none
        return preconditioner if shortening == math.inf else torch.minimum(preconditioner, adam * shortening)

    @staticmethod
    def _refresh_curvature(state: dict, group: dict, param: torch.Tensor) -> None:
        """Cache h_hat, the bias-corrected curvature EMA (zero on rows without any estimate), and
        each row's share taken off Adam's floor (1 - 1/L where the row has an estimate, else 0).
        Both change only with an estimate, and both are per-row state that density control
        carries with the rows: a new row's zeros mean no curvature and Adam's floor."""
        count = per_row(state["hessian_count"].double(), param)
        correction = torch.where(count > 0, 1 - group["hessian_beta"] ** count, torch.ones_like(count))
        state["curvature"] = state["hessian"] / correction.to(param.dtype)
        estimated = (state["hessian_count"] > 0).to(param.dtype)
        state["lengthening"] = per_row(estimated * (1 - 1 / group["max_lengthening"]), param).contiguous()

    @torch.no_grad()
    def update_hessian(self, estimates: Union[torch.Tensor, Sequence[torch.Tensor]],
                       visible: Optional[torch.Tensor] = None, ok: Optional[torch.Tensor] = None) -> None:
        """Fold one curvature estimate per parameter (in parameter order; a bare tensor
        when there is one parameter) into the EMA, for the visible rows only. An invisible
        Gaussian's estimate is zero because no pixel saw it, and folding that in would
        dilute its curvature for the views in which it is seen."""
        params = [p for group in self.param_groups for p in group["params"]]
        estimates = [estimates] if torch.is_tensor(estimates) else list(estimates)
        if len(estimates) != len(params):
            raise ValueError(f"update_hessian got {len(estimates)} estimates for {len(params)} parameters")
        index = 0
        for group in self.param_groups:
            beta = group["hessian_beta"]
            for param in group["params"]:
                estimate = estimates[index].detach()
                index += 1
                if estimate.shape != param.shape:
                    raise ValueError(
                        f"curvature estimate has shape {tuple(estimate.shape)}, parameter {tuple(param.shape)}"
                    )
                rows = rows_and_ok(self.rows_mask(visible, param), ok)
                state = self._state(param)
                hessian = state["hessian"].lerp(estimate.to(param.dtype), 1 - beta)
                assign(state["hessian"], hessian, rows)
                state["hessian_count"].add_(1 if rows is None else rows.to(param.dtype))
                self._refresh_curvature(state, group, param)
                if group["calibration_quantile"] is not None:
                    kappa = self._calibrated_curvature_scale(state, group, param)
                    state["kappa"] = kappa if ok is None else torch.where(ok, kappa, state["kappa"])

    def _calibrated_curvature_scale(self, state: dict, group: dict, param: torch.Tensor) -> torch.Tensor:
        """The kappa at which the Newton step equals Adam's at the `calibration_quantile` of
        sqrt(v_hat) / h_hat over the coordinates that have both (0 while there are none).
        Coordinates with a smaller ratio (stiffer, or less noisy) take shorter steps than Adam,
        those with a larger one longer steps, up to max_lengthening."""
        beta2 = group["betas"][1]
        steps = state["step"].to(param.device).clamp_min(1)  # stays on the device: no read
        adam = state["exp_avg_sq"].sqrt() / (1 - beta2 ** steps).sqrt().to(param.dtype)
        return calibration_quantile(adam, state["curvature"], group["calibration_quantile"])


def _check_hyperparameters(lr, betas, eps, hessian_beta, curvature_scale, clip, max_lengthening,
                           calibration_quantile, max_shortening=math.inf) -> None:
    """Hyperparameters come from the user's config, so a bad one is a TurboGSError."""
    problems = []
    if not lr >= 0:
        problems.append(f"lr must be >= 0, got {lr}")
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        problems.append(f"betas must be two numbers in [0, 1), got {betas}")
    if not eps >= 0:
        problems.append(f"eps must be >= 0, got {eps}")
    if not 0 <= hessian_beta < 1:
        problems.append(f"hessian_beta must be in [0, 1), got {hessian_beta}")
    if not curvature_scale >= 0:
        problems.append(f"curvature_scale must be >= 0, got {curvature_scale}")
    if clip is not None and not clip > 0:
        problems.append(f"clip must be > 0 or None, got {clip}")
    if not max_lengthening >= 1:
        problems.append(f"max_lengthening must be >= 1, got {max_lengthening}")
    if not max_shortening >= 1:
        problems.append(f"max_shortening must be >= 1, got {max_shortening}")
    if calibration_quantile is not None and not 0 < calibration_quantile < 1:
        problems.append(f"calibration_quantile must be in (0, 1) or None, got {calibration_quantile}")
    if problems:
        raise TurboGSError("hybrid optimizer: " + "; ".join(problems))
