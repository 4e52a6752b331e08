"""Turbo against 3dgs on every kind of capture users bring, as users run them.

    python benchmarks/capture_kinds.py --captures /tmp/captures --steps 1000 --seeds 0,1 \
        --extra fox=PATH/fox:r=8 --out benchmarks/results/DATE_cpu_capture_kinds.md

For each capture it runs `turbogs train --eval` (each a process of its own, one thread):
turbo and 3dgs for --steps steps (equal steps), and turbo as its default preset runs, the
100-second budget (--budget 0 skips it). It prints and writes a markdown table per run and the
mean over seeds: test PSNR, SSIM, the starting Gaussian count (from the run's log) and the final
one, and the steps made. The captures are those `scenes/make_captures.py` writes (made into
--captures when missing) and the demo (COLMAP with points); --extra NAME=PATH[:r=R][:w] adds
others, e.g. a real capture (`:w` = white background, `:r=R` = as train -r R; the scene form of
every benchmark, turbogs/bench/scenes.py, without settings: these runs are `turbogs train`'s).

Run it with another checkout on PYTHONPATH (and TURBOGS_PYTHON=that venv's python) to get the
"before" column of a change.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

from turbogs.bench.scenes import scene_arg, without_settings
from turbogs.errors import InputError

REPO = Path(__file__).resolve().parents[1]
KINDS = {  # name: (capture folder under --captures or a path, extra train flags)
    "demo (COLMAP, points)": (str(REPO / "scenes" / "demo"), []),
    "forward (no points)": ("forward", []),
    "forward_points": ("forward_points", []),
    "exposure": ("exposure", []),
    "masks": ("masks", []),
    "synthetic (object on white)": ("synthetic", ["-w"]),
}
STARTED = re.compile(r"initialisation: (?:the capture's )?(\d+) points")


def train(path: str, flags: List[str], preset: str, steps: int, budget: float, seed: int, out: Path) -> dict:
    command = [os.environ.get("TURBOGS_PYTHON", sys.executable), "-m", "turbogs", "train", path, "--eval", "--quiet",
               "--preset", preset, "--seed", str(seed), "--out", str(out), *flags]
    command += ["--budget-seconds", str(budget)] if budget else ["--steps", str(steps)]
    done = subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    results = json.loads((out / "results.json").read_text())
    started = STARTED.search(done.stdout)
    return {"psnr": results["psnr"], "ssim": results["ssim"], "start": int(started.group(1)) if started else None,
            "final": results["num_gaussians"], "steps": results["steps"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--captures", required=True, help="folder with make_captures.py's captures (made if missing)")
    parser.add_argument("--steps", type=int, default=1000, help="steps of the equal-steps runs (default 1000)")
    parser.add_argument("--budget", type=float, default=100.0, help="turbo's budget run in seconds (0 = none)")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    parser.add_argument("--only", help="comma-separated capture names (default: all)")
    parser.add_argument("--turbo-only", action="store_true", help="skip the 3dgs runs (e.g. for a 'before' column)")
    parser.add_argument("--extra", action="append", default=[], type=scene_arg,
                        help="NAME=PATH[:r=R][:w], another capture (repeatable)")
    parser.add_argument("--out", help="markdown file to write the tables to")
    args = parser.parse_args()

    kinds: Dict[str, tuple] = dict(KINDS)
    for extra in args.extra:
        try:
            kinds[extra.label] = (str(without_settings(extra, "capture_kinds.py").path), extra.train_flags())
        except InputError as error:
            parser.error(str(error))
    if args.only:
        kinds = {k: v for k, v in kinds.items() if any(k.startswith(o) for o in args.only.split(","))}
    captures = Path(args.captures)
    sys.path.insert(0, str(REPO / "scenes"))
    import make_captures

    runs = [("turbo", args.steps, 0.0)] + ([] if args.turbo_only else [("3dgs", args.steps, 0.0)])
    runs += [("turbo", 0, args.budget)] if args.budget else []
    rows, means = [], []
    with tempfile.TemporaryDirectory() as scratch:
        for name, (where, flags) in kinds.items():
            path = where if os.path.isabs(where) or os.path.exists(where) else str(captures / where)
            if not os.path.exists(path):
                make_captures.make_capture(where, str(captures))
            for preset, steps, budget in runs:
                label = f"{preset} {budget:g} s" if budget else f"{preset} {steps} steps"
                results = []
                for seed in [int(s) for s in args.seeds.split(",")]:
                    out = Path(scratch) / f"{len(rows)}"
                    r = train(path, flags, preset, steps, budget, seed, out)
                    results.append(r)
                    row = (f"| {name} | {label} | {seed} | {r['psnr']:.2f} | {r['ssim']:.3f} | {r['start']} | {r['final']} "
                           f"| {r['steps']} |")
                    rows.append(row)
                    print(row, flush=True)
                spread = [r["psnr"] for r in results]
                means.append(f"| {name} | {label} | {statistics.mean(spread):.2f} ({min(spread):.2f}-{max(spread):.2f}) "
                             f"| {statistics.mean(r['final'] for r in results):.0f} |")
    table = ["| capture | run | seed | PSNR | SSIM | start | final | steps |", "|---|---|---|---|---|---|---|---|", *rows,
             "", "| capture | run | mean PSNR (min-max over seeds) | mean final Gaussians |", "|---|---|---|---|", *means]
    print("\n".join(table))
    if args.out:
        Path(args.out).write_text(f"`{' '.join(sys.argv)}`\n\n" + "\n".join(table) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
