"""Per-photo appearance: a learned affine colour transform for each training image.

Photos of one place differ in exposure and white balance. Without a model of that, the
Gaussians average the photos into a compromise and every view is off by its own colour
cast. `--appearance` gives each training image a 3x3 matrix plus a bias, applied to the
render after rasterisation (colour' = M @ colour + b), so that the Gaussians hold one
consistent scene and the per-photo differences go into the transforms (as NeRF-W's and
the 3DGS in-the-wild papers' appearance embeddings do, in their simplest affine form).

- Each transform starts at the identity and is regularised towards it, and after each
  step the transforms are re-centred so that their mean is exactly the identity: a
  colour change common to all photos must live in the scene, so the uncorrected model
  shows the average photo (what the viewer, the exports and `psnr` see).
- Its own small Adam, one parameter pair per image, so a step moves only the image it
  rendered.
- Only training images have one. Test views, the viewer and the exports show the
  uncorrected model; `metrics.affine_color_fit` gives the colour-corrected test metric
  (`psnr_cc`) the in-the-wild benchmarks report instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from turbogs.errors import TurboGSError


@dataclass
class AppearanceConfig:
    enabled: bool = False
    lr: float = 5e-3  # a view is seen once per epoch: few, large steps must reach a 1.5x exposure change
    weight: float = 1e-2  # pull towards the identity: |M - I|^2 + |b|^2, per rendered image


class Appearance(torch.nn.Module):
    """One affine colour transform per training image, with its optimizer."""

    def __init__(self, num_views: int, cfg: AppearanceConfig, device: torch.device = torch.device("cpu")):
        super().__init__()
        self.cfg = cfg
        self.matrices = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.eye(3, device=device)) for _ in range(num_views)])
        self.biases = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.zeros(3, device=device)) for _ in range(num_views)])
        # fused: a skipped (non-finite) step is masked on the device through found_inf, no read
        self.optimizer = torch.optim.Adam(self.parameters(), lr=cfg.lr, fused=True)

    def forward(self, image: torch.Tensor, view: int) -> torch.Tensor:
        """[H, W, 3] render -> the same render as training photo `view` would show it."""
        return image @ self.matrices[view].T + self.biases[view]

    def regularizer(self, view: int) -> torch.Tensor:
        eye = torch.eye(3, device=self.matrices[view].device)
        return self.cfg.weight * (((self.matrices[view] - eye) ** 2).sum() + (self.biases[view] ** 2).sum())

    def step(self, ok: Optional[torch.Tensor] = None) -> None:
        """`ok`: a device bool; where False (a non-finite step) nothing changes, with no host read
        (fused Adam's found_inf, as in turbogs.optim.base).
        Only the rendered view has a gradient; Adam skips the others (grad None). Then the
        transforms are re-centred so that their mean is the identity: a colour shift common
        to all photos belongs to the scene, not to the corrections (measured without this:
        the transforms drifted together, the Gaussians the other way, and the uncorrected
        model lost 6 dB on a capture whose photos all share one exposure)."""
        if ok is not None:
            self.optimizer.found_inf = (~ok).to(torch.float32)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():  # after a skipped step the mean is still the identity: no change
            matrix_drift = torch.stack(list(self.matrices)).mean(dim=0) - torch.eye(3, device=self.matrices[0].device)
            bias_drift = torch.stack(list(self.biases)).mean(dim=0)
            for matrix, bias in zip(self.matrices, self.biases):
                matrix -= matrix_drift
                bias -= bias_drift

    def state(self) -> dict:
        return {"params": {k: v.detach().cpu() for k, v in self.state_dict().items()},
                "optimizer": self.optimizer.state_dict()}

    def load(self, state: dict) -> None:
        self.load_state_dict(state["params"])
        self.optimizer.load_state_dict(state["optimizer"])

    def as_json(self, names: List[str]) -> Dict[str, dict]:
        """Per training image: its matrix (row-major) and bias, for appearance.json."""
        return {name: {"matrix": self.matrices[i].detach().cpu().tolist(), "bias": self.biases[i].detach().cpu().tolist()}
                for i, name in enumerate(names)}


@torch.no_grad()
def load_appearance(appearance: Optional[Appearance], state: Optional[dict]) -> None:
    """Restore a checkpoint's transforms; a run and its checkpoint must agree on --appearance."""
    if (appearance is None) != (state is None):
        raise TurboGSError("the checkpoint was trained " + ("with" if state is not None else "without")
                           + " --appearance; resume " + ("with" if state is not None else "without") + " it too")
    if appearance is not None:
        appearance.load(state)
