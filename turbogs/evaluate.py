"""Evaluation on held-out views: PSNR, SSIM, LPIPS (when its weights are local).

`psnr` is the model as it renders (no colour correction: test views have no learned
appearance); `psnr_cc` is the PSNR after the least-squares affine colour fit of each
render to its ground truth, the colour-corrected figure in-the-wild benchmarks report.
With a mask, both count the valid pixels only.

Writes INRIA's layout: `results.json`, `per_view.json`, and the renders beside their
ground truth in `test/ours_N/{renders,gt}/` as PNGs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

from turbogs.data.scene import Camera
from turbogs.fileio import atomic_write_json
from turbogs.gaussians import Gaussians
from turbogs.metrics import affine_color_fit, lpips_or_none, lpips_unavailable_reason, psnr, ssim
from turbogs.render import render
from turbogs.render.png import write_png


@torch.no_grad()
def evaluate_views(gaussians: Gaussians, cameras: List[Camera], background: torch.Tensor,
                   log: Callable[[str], None] = print, lpips_note: bool = True) -> Dict[str, object]:
    """Mean and per-view metrics; `renders` holds the images for saving."""
    lpips = lpips_or_none(background.device)
    if lpips is None and lpips_note:
        log(f"LPIPS skipped: {lpips_unavailable_reason()}")
    per_view, renders = {}, []
    device = gaussians.means.device
    for camera in cameras:
        out = render(gaussians, camera, background=background)
        gt = camera.image.to(device)
        mask = None if camera.mask is None else camera.mask.to(device)
        image = out.image.clamp(0, 1)
        if mask is not None:  # masked-out pixels show the background in both images
            gt = gt * mask[..., None] + background * (1 - mask[..., None])
            image = image * mask[..., None] + background * (1 - mask[..., None])
        valid = mask if mask is not None and float(mask.sum()) > 0 else None  # PSNR over the valid pixels only
        entry = {"psnr": psnr(image, gt, valid), "ssim": float(ssim(image, gt)),
                 "psnr_cc": psnr(affine_color_fit(image, gt, valid), gt, valid)}
        if lpips is not None:
            entry["lpips"] = float(lpips(image, gt))
        per_view[camera.name] = entry
        renders.append((camera.name, image, gt))
    keys = per_view[next(iter(per_view))].keys() if per_view else []
    means = {k: float(np.mean([v[k] for v in per_view.values()])) for k in keys}
    return {"mean": means, "per_view": per_view, "renders": renders,
            "lpips_backbone": "vgg" if lpips is not None else None}


def write_evaluation(model_dir: Path, step: int, evaluation: Dict[str, object], extra: Optional[dict] = None,
                     save_images: bool = True) -> Dict[str, object]:
    """results.json (mean metrics plus `extra`), per_view.json and the PNGs."""
    model_dir = Path(model_dir)
    results = {**evaluation["mean"], **(extra or {}), "step": step, "num_test_views": len(evaluation["per_view"])}
    if evaluation.get("lpips_backbone"):
        results["lpips_backbone"] = evaluation["lpips_backbone"]
    atomic_write_json(model_dir / "results.json", results)
    atomic_write_json(model_dir / "per_view.json", evaluation["per_view"])
    if save_images:
        folder = model_dir / "test" / f"ours_{step}"
        for name, image, gt in evaluation["renders"]:
            stem = Path(name).stem
            write_png(folder / "renders" / f"{stem}.png", image)
            write_png(folder / "gt" / f"{stem}.png", gt)
    return results


def metrics_line(results: dict) -> str:
    """The figures a user reads after train and eval, from results.json's means."""
    line = f"PSNR {results['psnr']:.2f} dB (colour-corrected {results['psnr_cc']:.2f}), SSIM {results['ssim']:.4f}"
    return line + (f", LPIPS {results['lpips']:.4f}" if "lpips" in results else "")
