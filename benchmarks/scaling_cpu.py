"""Views per second and test PSNR at 1 rank against 2 ranks, side by side, at equal views.

    python benchmarks/scaling_cpu.py --scene scenes/demo --scene PATH/test_colmap:8 \
        --views 800 --presets turbo,3dgs --out benchmarks/results/DATE_cpu_scaling.md

For each capture and preset it runs, back to back, `turbogs train --eval` on one process for
V steps and with `--nproc 2` for V/2 steps (the same V views trained; each rank one thread,
gloo), and with --lr-rules also the 2-rank run at each learning-rate rule for batches. It
prints and writes one markdown table: views/s, its ratio to one rank, test PSNR and the
Gaussian count. A capture is PATH or PATH:R (R = the -r downscale).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def train(scene: str, preset: str, views: int, nproc: int, lr_rule: str, out: Path) -> dict:
    path, _, resolution = scene.partition(":")
    command = [sys.executable, "-m", "turbogs", "train", path, "--preset", preset, "--eval", "--quiet",
               "--steps", str(views // nproc), "--out", str(out), "--batch-lr", lr_rule]
    if resolution:
        command += ["-r", resolution]
    if nproc > 1:
        command += ["--nproc", str(nproc)]
    subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL)
    return json.loads((out / "results.json").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scene", action="append", required=True, help="capture, PATH or PATH:R (repeatable)")
    parser.add_argument("--views", type=int, default=800, help="views trained per run (default 800)")
    parser.add_argument("--presets", default="turbo,3dgs")
    parser.add_argument("--lr-rules", default="sqrt", help="rules for the 2-rank runs, e.g. sqrt,none")
    parser.add_argument("--out", required=True, help="the markdown file to write")
    args = parser.parse_args()

    rows = ["| capture | preset | ranks | lr rule | steps | views/s | x 1 rank | test PSNR (dB) | Gaussians |",
            "|---|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as scratch:
        for number, scene in enumerate(args.scene):
            for preset in args.presets.split(","):
                runs = [(1, "sqrt")] + [(2, rule) for rule in args.lr_rules.split(",")]
                base = None
                for index, (nproc, rule) in enumerate(runs):
                    result = train(scene, preset, args.views, nproc, rule, Path(scratch) / f"{number}-{preset}-{index}")
                    base = base or result["views_per_second"]
                    rows.append(f"| {scene} | {preset} | {nproc} | {rule if nproc > 1 else '-'} | {result['steps']} | "
                                f"{result['views_per_second']:.2f} | {result['views_per_second'] / base:.2f} | "
                                f"{result['psnr']:.2f} | {result['num_gaussians']} |")
                    print(rows[-1], flush=True)
    command = "python benchmarks/scaling_cpu.py " + " ".join(sys.argv[1:])
    text = f"# 1 rank against 2 ranks at equal views (CPU, gloo, one thread per rank)\n\n`{command}`\n\n" + "\n".join(rows) + "\n"
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
