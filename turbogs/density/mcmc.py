"""3DGS-MCMC density control (Kheradmand et al., "3D Gaussian Splatting as Markov Chain Monte
Carlo", 2024): a fixed budget of Gaussians, moved instead of cloned.

Why: users set a count beforehand (for the web, a phone, the GPU's memory) and MCMC is the
standard answer. The Gaussians are read as samples of a distribution that the loss shapes;
density control then needs no heuristics, only moves that keep the rendered image:

- **Relocation.** Every `refine_every` steps in [refine_from, refine_until), the dead
  Gaussians (opacity <= min_opacity) are moved onto live ones, drawn with probability in
  proportion to their opacity. A source drawn so that it ends up as n copies of itself gets
  the paper's correction, so that the n copies composite to about what the one did:
      opacity' = 1 - (1 - opacity)^(1/n)
      scale'   = scale x opacity / sum_{k=1..n} C(n, k) (-1)^(k+1) opacity'^k / sqrt(k)
  (the second keeps the integral of the composited profile along a ray through the centre;
  `relocation_values`). Copies and source all start with zero optimizer moments.
- **Growth** to exactly `max_gaussians`: at each refinement the count grows by `grow_rate`
  (5 %), never past the cap; new Gaussians are more copies drawn the same way. The count
  never shrinks, and never exceeds the cap (a start above it is cut to it at the first step,
  keeping the most opaque).
- **Noise** on the means every step: eps ~ N(0, Sigma) (the Gaussian's own covariance),
  scaled by the position learning rate x `noise_lr` and gated by the opacity
  (sigmoid(k ((1 - opacity) - (1 - min_opacity))), k = 100): transparent Gaussians explore,
  opaque ones stay.
- **Regularizers** on the mean opacity and the mean scale (`regularizer`), which push
  Gaussians the image does not need towards death, and so towards relocation.

Schedules are fractions of the run (gsplat's 500 and 25,000 of 30,000 steps), so a run for
a time budget works like one of steps. All row changes go through `turbogs.density.rows`:
one masked overwrite of the sources (`rows.set_rows`, which zeroes their moments) and one
rebuild that drops the dead and appends the copies; one host read per refinement (the
number of dead Gaussians, to size the draw).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch
from torch import Tensor

from turbogs.density import rows
from turbogs.density.base import DensityConfig, DensityStep, Strategy
from turbogs.errors import InputError
from turbogs.gaussians import Gaussians
from turbogs.kernels.projection_torch import covariance

MAX_COPIES = 51  # a source drawn more often is corrected as 51 copies (gsplat's table size)
NOISE_SHARPNESS = 100.0  # k of the opacity gate on the noise


@dataclass
class McmcDensityConfig(DensityConfig):
    """3DGS-MCMC's settings (gsplat's MCMCStrategy defaults); schedules are fractions of the run."""

    name = "mcmc"
    step_counted = ("refine_every",)

    max_gaussians: int = 1_000_000  # the cap: the count grows to it and never past it
    refine_from: float = 500 / 30_000  # relocate and grow while refine_from <= progress < refine_until
    refine_until: float = 25_000 / 30_000
    refine_every: int = 100  # steps between refinements
    grow_rate: float = 0.05  # growth per refinement, as a fraction of the count
    min_opacity: float = 0.005  # dead below (or at) this opacity: relocated
    noise_lr: float = 5e5  # the position noise, in units of the means' learning rate
    opacity_reg: float = 0.01  # x mean opacity, added to the loss
    scale_reg: float = 0.01  # x mean scale (world units), added to the loss

    def __post_init__(self):
        def check(ok: bool, what: str):
            if not ok:
                raise InputError(f"mcmc density setting: {what}")

        check(0 <= self.refine_from < self.refine_until <= 1,
              f"need 0 <= refine_from ({self.refine_from}) < refine_until ({self.refine_until}) <= 1")
        for name in ("max_gaussians", "refine_every"):
            check(getattr(self, name) >= 1, f"{name} must be at least 1, got {getattr(self, name)}")
        check(0 < self.min_opacity < 1, f"min_opacity must be in (0, 1), got {self.min_opacity}")
        for name in ("grow_rate", "noise_lr", "opacity_reg", "scale_reg"):
            check(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")

    def build(self) -> "McmcDensity":
        return McmcDensity(self)


def relocation_values(opacities: Tensor, copies: Tensor) -> tuple:
    """(opacity', scale factor) of a Gaussian of `opacities` [M] split into `copies` [M] (>= 1)
    identical ones: 1 - (1 - o)^(1/n), and o / sum_{k=1..n} C(n, k) (-1)^(k+1) o'^k / sqrt(k).
    n = 1 gives (o, 1). The alternating sum runs in float64 (n <= MAX_COPIES keeps its
    terms small enough); tests/test_density_mcmc.py checks it against a quadrature."""
    n = copies.clamp(1, MAX_COPIES).to(torch.float64)
    o = opacities.to(torch.float64)
    new = 1.0 - torch.pow(1.0 - o, 1.0 / n)
    k = torch.arange(1, MAX_COPIES + 1, dtype=torch.float64, device=o.device)  # [K]
    log_binom = torch.lgamma(n[:, None] + 1) - torch.lgamma(k + 1) - torch.lgamma((n[:, None] - k + 1).clamp_min(1))
    terms = torch.exp(log_binom) * torch.pow(-1.0, k + 1) * torch.pow(new[:, None], k) / torch.sqrt(k)
    denominator = torch.where(k <= n[:, None], terms, 0.0).sum(dim=1)
    return new.to(opacities.dtype), (o / denominator).to(opacities.dtype)


class McmcDensity(Strategy):
    """Relocation of dead Gaussians, growth to a cap, position noise and regularizers.
    It keeps no per-Gaussian statistics (`state` is empty)."""

    def __init__(self, config: Optional[McmcDensityConfig] = None):
        self.config = config or McmcDensityConfig()

    def regularizer(self, gaussians: Gaussians) -> Optional[Tensor]:
        cfg = self.config
        if cfg.opacity_reg == 0 and cfg.scale_reg == 0:
            return None
        return cfg.opacity_reg * gaussians.opacities.mean() + cfg.scale_reg * gaussians.scales.mean()

    def should_refine(self, step: int, progress: float) -> bool:
        cfg = self.config
        return step > 0 and step % cfg.refine_every == 0 and cfg.refine_from <= float(progress) < cfg.refine_until

    def target_count(self, n: int) -> int:
        """The count after a refinement of `n`: grown by grow_rate, never past the cap."""
        return min(self.config.max_gaussians, max(n, int(n * (1.0 + self.config.grow_rate))))

    @torch.no_grad()
    def control(self, state: Dict[str, Tensor], step_info: DensityStep) -> Dict[str, object]:
        gaussians, optimizers = step_info.gaussians, step_info.optimizers
        stats: Dict[str, object] = {"densified": False, "n_cloned": 0, "n_relocated": 0}
        if len(gaussians) > self.config.max_gaussians:  # a start above the cap (a host int: no read)
            stats["n_pruned"] = self.cut_to_cap(state, gaussians, optimizers)
        if self.should_refine(step_info.step, step_info.progress) and step_info.good():
            stats.update(self.relocate_and_grow(state, gaussians, optimizers))
        self.inject_noise(gaussians, optimizers, step_info.ok)
        stats["n_gaussians"] = len(gaussians)
        stats["budget"] = self.config.max_gaussians
        return stats

    def cut_to_cap(self, state, gaussians: Gaussians, optimizers: rows.Optimizers) -> int:
        """Keep the max_gaussians most opaque Gaussians (in their order)."""
        n, cap = len(gaussians), self.config.max_gaussians
        keep = torch.zeros(n, dtype=torch.bool, device=gaussians.means.device)
        keep[torch.topk(gaussians.params["opacities"].detach(), cap).indices] = True
        state.update(rows.remove_rows(gaussians, optimizers, keep, extra=state))
        return n - cap

    def relocate_and_grow(self, state, gaussians: Gaussians, optimizers: rows.Optimizers) -> Dict[str, object]:
        """Move the dead onto live ones drawn by opacity, and add copies up to the target count,
        in one draw: every drawn source becomes `copies` corrected Gaussians (itself included)."""
        cfg = self.config
        n = len(gaussians)
        opacities = gaussians.opacities.detach()
        dead = opacities <= cfg.min_opacity
        count = rows.read_counts(dead=dead)  # the one host read
        n_dead, n_add = count["dead"], self.target_count(n) - n
        if n_dead == n or n_dead + n_add == 0:  # nothing alive to copy, or nothing to do
            return {"densified": False, "n_cloned": 0, "n_relocated": 0}
        weights = torch.where(dead, 0.0, opacities).float()
        drawn = torch.multinomial(weights, n_dead + n_add, replacement=True)
        copies = 1 + torch.bincount(drawn, minlength=n)  # per row: itself plus its draws
        is_source = copies > 1
        new_opacity, scale_factor = relocation_values(opacities, copies)
        logits = torch.logit(new_opacity.clamp(cfg.min_opacity, 1.0 - 1e-6))
        log_scales = gaussians.params["scales"].detach() + torch.log(scale_factor)[:, None]
        rows.set_rows(gaussians, optimizers, is_source, {"opacities": logits, "scales": log_scales})
        kept = rows.mask_index(~dead, n - n_dead)
        new_rows = {name: gaussians.params[name].detach().index_select(0, drawn) for name in gaussians.params}
        state.update(rows.rebuild_rows(gaussians, optimizers, kept, new_rows, extra=state))
        return {"densified": True, "n_cloned": n_add, "n_relocated": n_dead}

    def inject_noise(self, gaussians: Gaussians, optimizers: rows.Optimizers, ok: Optional[Tensor]) -> None:
        """means += lr x noise_lr x gate(opacity) x Sigma eps: a Langevin step's exploration,
        for the transparent Gaussians only; nothing on a non-finite step (masked, no read)."""
        if self.config.noise_lr == 0 or "means" not in optimizers:
            return
        lr = optimizers["means"].param_groups[0]["lr"]
        opacities = gaussians.opacities.detach()
        gate = torch.sigmoid(NOISE_SHARPNESS * ((1.0 - opacities) - (1.0 - self.config.min_opacity)))
        means = gaussians.params["means"]
        cov = covariance(gaussians.quats.detach(), gaussians.scales.detach())
        eps = torch.randn(means.shape, dtype=means.dtype, device=means.device)
        noise = torch.einsum("nij,nj->ni", cov, eps) * (gate * (lr * self.config.noise_lr))[:, None]
        if ok is not None:
            noise = torch.where(ok, noise, 0.0)
        means.data.add_(noise)

