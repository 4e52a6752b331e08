"""Gaussian parameters, their activations, and initialisation from points.

Parameters are stored *pre-activation*, exactly as INRIA's .ply stores them, so that
optimizer steps act on unconstrained values:

| name      | shape          | activation            |
|-----------|----------------|-----------------------|
| means     | [N, 3]         | none                  |
| scales    | [N, 3]         | exp (log-scale)       |
| quats     | [N, 4] (wxyz)  | normalize             |
| opacities | [N]            | sigmoid (logit)       |
| sh0       | [N, 1, 3]      | SH DC coefficient     |
| shN       | [N, K-1, 3]    | higher SH bands       |
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional

import torch

SH_C0 = 0.28209479177387814  # Y_0^0, maps a DC coefficient to a color offset
PARAM_NAMES = ("means", "scales", "quats", "opacities", "sh0", "shN")


def rgb_to_sh(rgb: torch.Tensor) -> torch.Tensor:
    """Color in [0, 1] -> DC coefficient such that color = SH_C0 * dc + 0.5."""
    return (rgb - 0.5) / SH_C0


def num_sh_bases(degree: int) -> int:
    return (degree + 1) ** 2


def mean_knn_distance(points: torch.Tensor, k: int = 3, chunk: int = 4096) -> torch.Tensor:
    """Mean distance of each point to its k nearest neighbours (INRIA's distCUDA2 idea),
    computed in chunks so that memory stays O(chunk * N)."""
    n = points.shape[0]
    if n <= 1:
        return torch.ones(n, dtype=points.dtype)
    k = min(k, n - 1)
    out = torch.empty(n, dtype=points.dtype)
    for start in range(0, n, chunk):
        block = points[start : start + chunk]
        d2 = torch.cdist(block, points).pow_(2)
        d2[torch.arange(block.shape[0]), torch.arange(start, start + block.shape[0])] = float("inf")
        nearest = d2.topk(k, dim=1, largest=False).values
        out[start : start + chunk] = nearest.clamp_min(1e-14).mean(dim=1).sqrt()
    return out


class Gaussians(torch.nn.Module):
    """A set of 3D Gaussians: a ParameterDict plus the active SH degree."""

    def __init__(self, params: Dict[str, torch.Tensor], sh_degree: int, active_sh_degree: int = 0,
                 antialiased: bool = False):
        super().__init__()
        self.params = torch.nn.ParameterDict(
            {name: torch.nn.Parameter(params[name].contiguous()) for name in PARAM_NAMES}
        )
        self.sh_degree = sh_degree  # the maximum degree stored in shN
        self.active_sh_degree = active_sh_degree  # raised during training
        # How the model is meant to be rendered: with Mip-Splatting's 2D filter and opacity
        # compensation (--antialiased). A property of the model, not of one render: its
        # opacities were trained against that compensation, so every render of it uses it.
        self.antialiased = antialiased

    # --- construction -------------------------------------------------------------
    @classmethod
    def from_points(
        cls,
        points: torch.Tensor,
        colors: torch.Tensor,
        sh_degree: int = 3,
        init_opacity: float = 0.1,
        init_scale: float = 1.0,
    ) -> "Gaussians":
        """INRIA's initialisation: isotropic Gaussians sized by neighbour distance,
        identity rotation, opacity 0.1, color in the DC band."""
        points = points.float()
        n = points.shape[0]
        dist = mean_knn_distance(points).clamp_min(1e-7) * init_scale
        quats = torch.zeros(n, 4)
        quats[:, 0] = 1.0
        params = {
            "means": points.clone(),
            "scales": torch.log(dist)[:, None].repeat(1, 3),
            "quats": quats,
            "opacities": torch.logit(torch.full((n,), init_opacity)),
            "sh0": rgb_to_sh(colors.float().clamp(0, 1))[:, None, :],
            "shN": torch.zeros(n, num_sh_bases(sh_degree) - 1, 3),
        }
        return cls(params, sh_degree)

    # --- views --------------------------------------------------------------------
    def __len__(self) -> int:
        return self.params["means"].shape[0]

    @property
    def means(self) -> torch.Tensor:
        return self.params["means"]

    @property
    def scales(self) -> torch.Tensor:
        return torch.exp(self.params["scales"])

    @property
    def quats(self) -> torch.Tensor:
        return torch.nn.functional.normalize(self.params["quats"], dim=-1)

    @property
    def opacities(self) -> torch.Tensor:
        return torch.sigmoid(self.params["opacities"])

    @property
    def sh(self) -> torch.Tensor:
        """All SH coefficients [N, K, 3]."""
        return torch.cat([self.params["sh0"], self.params["shN"]], dim=1)

    def gradient_columns(self) -> List[Optional[int]]:
        """Per parameter (in `params`' order), how many leading coefficients (dim 1) of its
        gradient can be nonzero; None for all. Of the higher SH bands only the active degree's:
        the renderer leaves the others' gradient exactly 0 (tests/test_render.py), so a step of
        several ranks does not send them (two thirds of the gradient while the degree is 0)."""
        return [num_sh_bases(self.active_sh_degree) - 1 if name == "shN" else None for name in self.params]

    def raw(self) -> Dict[str, torch.Tensor]:
        """Detached pre-activation tensors, for saving."""
        return {k: v.detach() for k, v in self.params.items()}

    def replace(self, params: Dict[str, torch.Tensor]) -> None:
        """Swap in new tensors (after densification or loading); rows may change."""
        for name in PARAM_NAMES:
            self.params[name] = torch.nn.Parameter(params[name].contiguous())


def sh_degree_from_coeffs(num_rest: int) -> int:
    """The SH degree implied by the number of higher-band coefficients per channel."""
    degree = int(round(math.sqrt(num_rest + 1))) - 1
    if num_sh_bases(degree) - 1 != num_rest:
        raise ValueError(f"{num_rest} higher-band SH coefficients match no SH degree")
    return degree
