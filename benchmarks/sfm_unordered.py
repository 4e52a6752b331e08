"""Which SfM settings help unordered photos: images registered (largest model) out of the total, and
the time, for our defaults against candidate settings, on several captures where the defaults lose
photos. Why these captures: the walk-around captures we test on register every photo with the
defaults, so they cannot show what helps; these thin out or scramble real and rendered captures.

    python benchmarks/sfm_unordered.py --captures /tmp/unordered --fox /tmp/fox --test-colmap PATH/test_colmap

Captures (made once into --captures, deterministic):
- fox_4th: every 4th of instant-ngp's 50 fox phone photos (13), names shuffled;
- fox_3rd_mixed: every 3rd (17), shuffled, every other one downscaled to 70% (one camera per photo);
- fox_6th: every 6th (9), shuffled;
- colmap_2nd / colmap_3rd / colmap_3rd_b / colmap_3rd_c: every 2nd (12) / 3rd from the 1st, 2nd, 3rd
  (8, 8, 7) of test_colmap's 23 photos, shuffled;
- orbit_10: scenes/'s speckled objects from 10 views on a ring (36 degrees apart: little overlap);
- orbit_mixed: scenes/'s `mixed_photos`: 16 ring views, every other one at 160x120 (one camera per photo).

Variants (turbogs.capture.sfm.SfmOptions): `default` (what `turbogs sfm` did before),
`retry` (a second mapping pass over the photos the first left out, with relaxed registration),
`guided` (guided matching), `features` (twice COLMAP's 8192 SIFT features), `all` (the three).
Every run uses one thread (num_threads=1) so that the times compare; the photos are SIFTed at
MAX_IMAGE_SIZE as `turbogs sfm` does.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import shutil
import sys
import time
from pathlib import Path

import cv2

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

VARIANTS = {
    "default": dict(retry=False),
    "retry": dict(retry=True),
    "guided": dict(retry=False, guided_matching=True),
    "features": dict(retry=False, max_num_features=16384),
    "all": dict(retry=True, guided_matching=True, max_num_features=16384),
}


def copy_shuffled(sources, folder: Path, seed: int, scale_every_other: float = 1.0) -> None:
    """The photos under random names (their order no longer says which overlap), optionally every
    other one resized (so that no two share a camera)."""
    folder.mkdir(parents=True, exist_ok=True)
    order = list(range(len(sources)))
    random.Random(seed).shuffle(order)
    for k, source in zip(order, sources):
        image = cv2.imread(str(source))
        if scale_every_other != 1.0 and k % 2:
            image = cv2.resize(image, None, fx=scale_every_other, fy=scale_every_other, interpolation=cv2.INTER_AREA)
        cv2.imwrite(str(folder / f"photo_{k:03d}.jpg"), image, [cv2.IMWRITE_JPEG_QUALITY, 95])


def make_captures(root: Path, fox: Path, test_colmap: Path) -> dict:
    spec = importlib.util.spec_from_file_location("make_captures", REPO / "scenes" / "make_captures.py")
    scenes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scenes)
    made = {}
    plans = {}
    if fox is not None:
        fox_photos = sorted((fox / "images").iterdir())
        plans.update({
            "fox_4th": lambda f: copy_shuffled(fox_photos[::4], f, 1),
            "fox_3rd_mixed": lambda f: copy_shuffled(fox_photos[::3], f, 2, 0.7),
            "fox_6th": lambda f: copy_shuffled(fox_photos[::6], f, 5),
        })
    if test_colmap is not None:
        colmap_photos = sorted((test_colmap / "images").iterdir())
        plans.update({
            "colmap_2nd": lambda f: copy_shuffled(colmap_photos[::2], f, 3),
            "colmap_3rd": lambda f: copy_shuffled(colmap_photos[::3], f, 4),
            "colmap_3rd_b": lambda f: copy_shuffled(colmap_photos[1::3], f, 6),
            "colmap_3rd_c": lambda f: copy_shuffled(colmap_photos[2::3], f, 7),
        })
    plans.update({
        "orbit_10": lambda f: scenes.make_mixed_photos(str(f), 10, None),
        "orbit_mixed": lambda f: scenes.make_mixed_photos(str(f)),
    })
    for name, plan in plans.items():
        folder = root / name
        if not folder.is_dir():
            plan(folder)
        made[name] = folder
    return made


def run(folder: Path, variant: str) -> dict:
    from turbogs.capture.photos import find_photos
    from turbogs.capture.sfm import SfmOptions, run_sfm
    from turbogs.capture.summary import SfmTooFew
    from turbogs.errors import InputError

    work = folder.parent / f".{folder.name}.{variant}"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(folder, work)
    options = SfmOptions(progress=False, num_threads=1, **VARIANTS[variant])
    start = time.perf_counter()
    total = len(find_photos(work).names)
    try:
        summary = run_sfm(find_photos(work), options, log=lambda _: None)
    except SfmTooFew as exc:  # under half registered: still a figure
        summary = exc.summary
    except InputError:  # none registered
        summary = None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"registered": summary.registered if summary else 0, "total": total, "seconds": time.perf_counter() - start,
            "retried": summary.retried if summary else 0, "models": summary.models if summary else []}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--captures", type=Path, required=True, help="folder for the captures (made once)")
    parser.add_argument("--fox", type=Path, help="instant-ngp's data/nerf/fox (images/); without it, no fox captures")
    parser.add_argument("--test-colmap", type=Path, help="the test_colmap capture (images/); without it, none of it")
    parser.add_argument("--only", nargs="*", help="captures to run (default: all)")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    captures = make_captures(args.captures, args.fox, args.test_colmap)
    rows = {}
    print("| capture | photos | " + " | ".join(args.variants) + " |")
    print("|---|---|" + "---|" * len(args.variants))
    for name, folder in captures.items():
        if args.only and name not in args.only:
            continue
        rows[name] = {}
        for variant in args.variants:
            rows[name][variant] = run(folder, variant)
            print(f"  {name} {variant}: {rows[name][variant]}", file=sys.stderr, flush=True)
            if args.json:
                args.json.write_text(json.dumps(rows, indent=1))
        total = next(iter(rows[name].values()))["total"]
        cells = [f"{r['registered']} ({r['seconds']:.0f} s)" for r in rows[name].values()]
        print(f"| {name} | {total} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
