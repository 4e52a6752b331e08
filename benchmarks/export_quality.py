"""What the compressed exports cost: file sizes, and PSNR on the capture's test views of the
.spz and .sog models, against the ground truth and against the .ply model's own renders.

    python benchmarks/export_quality.py MODEL_DIR OUT_DIR

Exports MODEL_DIR to OUT_DIR/model.{ply,splat,spz,sog} with `turbogs export`, then renders the
test views of the capture named in MODEL_DIR/cfg_args from each readable export.
"""

import argparse
import json
from pathlib import Path

import torch

from turbogs.cli import main as turbogs
from turbogs.formats import read_gaussians
from turbogs.formats.model_folder import scene_for_model
from turbogs.gaussians import Gaussians
from turbogs.metrics import psnr
from turbogs.render import render


def renders(path: Path, cameras):
    params, degree = read_gaussians(path)
    gaussians = Gaussians({k: torch.from_numpy(v) for k, v in params.items()}, degree, active_sh_degree=degree)
    with torch.no_grad():
        return [render(gaussians, c, background=torch.zeros(3)).image.clamp(0, 1) for c in cameras]


def mean_psnr(images, targets) -> float:
    return sum(float(psnr(a, b)) for a, b in zip(images, targets)) / len(images)


def run(model_dir: Path, out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    sizes = {}
    for fmt in ("ply", "splat", "spz", "sog"):
        path = out_dir / f"model.{fmt}"
        assert turbogs(["export", str(model_dir), "-o", str(path)]) == 0
        sizes[fmt] = path.stat().st_size
    scene = scene_for_model(model_dir, None, eval_split=True)
    truth = [c.image for c in scene.test]
    reference = renders(out_dir / "model.ply", scene.test)
    quality = {"ply": {"psnr_vs_ground_truth": mean_psnr(reference, truth)}}
    for fmt in ("spz", "sog"):
        images = renders(out_dir / f"model.{fmt}", scene.test)
        quality[fmt] = {"psnr_vs_ground_truth": mean_psnr(images, truth), "psnr_vs_ply_render": mean_psnr(images, reference)}
    return {"test_views": len(scene.test), "bytes": sizes, "quality": quality}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path, help="a model folder trained with --eval")
    parser.add_argument("out_dir", type=Path, help="where the exports are written")
    args = parser.parse_args()
    print(json.dumps(run(args.model_dir, args.out_dir), indent=2))


if __name__ == "__main__":
    main()
