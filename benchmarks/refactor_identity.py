"""Does a refactor change any result? Train both presets with a fixed seed on the demo capture
with the code of another commit and with this tree, on this machine, and compare bit for bit.

    python benchmarks/refactor_identity.py --base main~3

Why two trees on one machine: another CPU rounds the last bits differently and training
amplifies them, so figures written down on one machine cannot check a refactor on another.
Both runs here use the same CPU, torch and thread count, so a pure move of code gives the same
bits and anything else shows. Each run is long enough to densify (3dgs at step 200, turbo at
steps 100 and 200), to switch turbo to sparse tiles and to take the hybrid optimizer's curvature
steps, so that every part of a step is covered.

tests/test_reproducible.py uses the same runs to check that one tree gives the same bits twice.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from plyfile import PlyData

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "scenes" / "demo"
RUNS = {"turbo": 300, "3dgs": 500}  # preset: steps
FIELDS = ("gaussians", "sum", "sum_abs", "psnr", "ssim")


def fingerprint(model_dir: Path) -> dict:
    """The Gaussian count, the signed and absolute sums of every PLY value, test PSNR and SSIM."""
    ply = sorted(model_dir.glob("point_cloud/iteration_*/point_cloud.ply"))[-1]
    vertex = PlyData.read(str(ply))["vertex"].data
    values = np.stack([vertex[name].astype(np.float64) for name in vertex.dtype.names], axis=1)
    results = json.loads((model_dir / "results.json").read_text())
    return dict(zip(FIELDS, (len(vertex), float(values.sum()), float(np.abs(values).sum()),
                             results["psnr"], results["ssim"])))


def train(tree: Path, preset: str, steps: int, out: Path) -> dict:
    """`python -m turbogs train` with the code in `tree` (first on the path), one thread."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-m", "turbogs", "train", str(DEMO), "--preset", preset, "--eval", "--steps",
               str(steps), "--seed", "0", "--threads", "1", "--out", str(out), "--quiet"]
    subprocess.run(command, check=True, env=env, cwd=tree, stdout=subprocess.DEVNULL)
    return fingerprint(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare this tree against (e.g. main~1)")
    parser.add_argument("--presets", default=",".join(RUNS), help="comma-separated presets (default: both)")
    args = parser.parse_args()
    same = True
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(base), args.base], check=True)
        try:
            for preset in args.presets.split(","):
                before = train(base, preset, RUNS[preset], Path(tmp) / f"{preset}_base")
                after = train(REPO, preset, RUNS[preset], Path(tmp) / f"{preset}_tree")
                same &= before == after
                print(f"{preset} ({RUNS[preset]} steps): {'same bits' if before == after else 'DIFFERENT'}")
                for field in FIELDS:
                    print(f"  {field:9s} {args.base}: {before[field]!r}  this tree: {after[field]!r}")
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
