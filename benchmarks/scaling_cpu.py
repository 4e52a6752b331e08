"""Views per second and test PSNR at 1 rank against 2 ranks, side by side, at equal views.

    python benchmarks/scaling_cpu.py --scene scenes/demo --scene PATH/test_colmap:r=8 \
        --views 800 --presets turbo,3dgs --repeats 3 --out benchmarks/results/DATE_cpu_scaling.md

For each capture and preset it runs, back to back, `turbogs train --eval` on one process for
V steps and with `--nproc 2` for V/2 steps (the same V views trained; each rank one thread,
gloo), and with --lr-rules also the 2-rank run at each learning-rate rule for batches. With
--repeats R it runs that series R times, interleaved (1, 2, 1, 2, ...), so that a slow spell
of a shared machine falls on both sides; the summary takes each side's median. With --seeds
0,1,2 each seed trains its own series (a test PSNR differs between seeds by more than between
rules, so a rule is judged on the mean over seeds). It prints and writes markdown tables: every
run's views/s, ratio to one rank, test PSNR and Gaussian count, then the medians (views/s) and
means (PSNR). A capture is `[NAME=]PATH[:r=R][:w]` (turbogs/bench/scenes.py: the scene form of
every benchmark, here without settings, since these runs are `turbogs train`'s).

With --ceiling each series also runs two independent 1-rank trainings of V views at once
(`2x1 indep.` rows): their summed views/s over the lone run's is what this machine gives two
processes at that moment, with no step shared. A 2-rank run's ratio against that ceiling is the
share its synchronous step keeps; the rest of the gap to 2x is the machine (two processes
contending for memory and caches on a small virtual machine whose speed drifts).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List

from turbogs.bench.scenes import SceneSpec, scene_arg, without_settings
from turbogs.errors import InputError


def train(scene: SceneSpec, preset: str, views: int, nproc: int, lr_rule: str, out: Path, seed: int = 0) -> dict:
    command = [sys.executable, "-m", "turbogs", "train", str(scene.path), *scene.train_flags(), "--preset", preset,
               "--eval", "--quiet", "--steps", str(views // nproc), "--out", str(out), "--seed", str(seed)]
    if lr_rule != "preset":
        command += ["--batch-lr", lr_rule]
    if nproc > 1:
        command += ["--nproc", str(nproc)]
    subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL)
    return json.loads((out / "results.json").read_text())


def train_two_at_once(scene: SceneSpec, preset: str, views: int, outs: List[Path], seed: int) -> List[dict]:
    """Two independent 1-rank trainings of `views` views, started together."""
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda out: train(scene, preset, views, 1, "preset", out, seed), outs))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scene", action="append", required=True, type=scene_arg,
                        help="capture, [NAME=]PATH[:r=R][:w] (repeatable)")
    parser.add_argument("--views", type=int, default=800, help="views trained per run (default 800)")
    parser.add_argument("--presets", default="turbo,3dgs")
    parser.add_argument("--lr-rules", default="preset",
                        help="--batch-lr rules for the 2-rank runs, e.g. grendel,sqrt (default: the preset's own)")
    parser.add_argument("--repeats", type=int, default=1, help="series per capture, preset and seed, interleaved")
    parser.add_argument("--seeds", default="0", help="training seeds, e.g. 0,1,2: one series (or --repeats) each")
    parser.add_argument("--ceiling", action="store_true",
                        help="also run two independent 1-rank trainings at once per series (the machine's own 2-process ratio)")
    parser.add_argument("--out", required=True, help="the markdown file to write")
    args = parser.parse_args()
    seeds = [int(seed) for seed in args.seeds.split(",")]
    try:
        scenes = [without_settings(scene, "scaling_cpu.py") for scene in args.scene]
    except InputError as error:
        parser.error(str(error))

    rows = ["| capture | preset | seed | ranks | lr rule | steps | views/s | x 1 rank | test PSNR (dB) | Gaussians |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    medians = ["| capture | preset | lr rule | views/s, 1 rank | views/s, 2 ranks | x 1 rank (medians) | x 1 rank (median pair) "
               "| 2 independent x 1 | PSNR 1 rank (mean) | PSNR 2 ranks (mean) | series |",
               "|---|---|---|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as scratch:
        for number, scene in enumerate(scenes):
            for preset in args.presets.split(","):
                runs = [(1, "preset")] + [(2, rule) for rule in args.lr_rules.split(",")]
                speeds = {run: [] for run in runs}
                psnrs = {run: [] for run in runs}
                ceilings = []
                for series, seed in enumerate(seed for seed in seeds for _ in range(args.repeats)):
                    base = None
                    for index, (nproc, rule) in enumerate(runs):
                        out = Path(scratch) / f"{number}-{preset}-{index}-{series}"
                        result = train(scene, preset, args.views, nproc, rule, out, seed)
                        speeds[(nproc, rule)].append(result["views_per_second"])
                        psnrs[(nproc, rule)].append(result["psnr"])
                        base = base or result["views_per_second"]
                        rows.append(f"| {scene} | {preset} | {seed} | {nproc} | {rule if nproc > 1 else '-'} | "
                                    f"{result['steps']} | {result['views_per_second']:.2f} | "
                                    f"{result['views_per_second'] / base:.2f} | {result['psnr']:.2f} | "
                                    f"{result['num_gaussians']} |")
                        print(rows[-1], flush=True)
                    if args.ceiling:
                        pair = train_two_at_once(scene, preset, args.views,
                                                 [Path(scratch) / f"{number}-{preset}-indep{k}-{series}" for k in (0, 1)],
                                                 seed)
                        both = sum(result["views_per_second"] for result in pair)
                        ceilings.append(both / base)
                        rows.append(f"| {scene} | {preset} | {seed} | 2x1 indep. | - | {pair[0]['steps']} | {both:.2f} | "
                                    f"{both / base:.2f} | {pair[0]['psnr']:.2f} | {pair[0]['num_gaussians']} |")
                        print(rows[-1], flush=True)
                one = statistics.median(speeds[runs[0]])
                for run in runs[1:]:
                    two = statistics.median(speeds[run])
                    ratios = [b / a for a, b in zip(speeds[runs[0]], speeds[run])]
                    ceiling = f"{statistics.median(ceilings):.2f}" if ceilings else "-"
                    medians.append(f"| {scene} | {preset} | {run[1]} | {one:.2f} | {two:.2f} | {two / one:.2f} | "
                                   f"{statistics.median(ratios):.2f} | {ceiling} | {statistics.mean(psnrs[runs[0]]):.2f} | "
                                   f"{statistics.mean(psnrs[run]):.2f} | {len(ratios)} |")
    command = "python benchmarks/scaling_cpu.py " + " ".join(sys.argv[1:])
    text = (f"# 1 rank against 2 ranks at equal views (CPU, gloo, one thread per rank)\n\n`{command}`\n\n"
            + "\n".join(rows) + "\n\nMedians over the series (PSNR: the mean over them):\n\n" + "\n".join(medians) + "\n")
    print("\n".join(medians))
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
