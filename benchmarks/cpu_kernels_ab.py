"""The CPU compositing kernels alone, this tree's against another revision's, side by side in one
process (issue 30): forward and backward milliseconds on the exact inputs a trainer hands them.

For each configuration (as in cpu_native_step.py: turbo at 10 % of a 1000-step run, every tile;
at 70 %, a quarter of the tiles) a trainer starts from N ray points of the capture and takes
--warmup steps; the inputs of its last rasterize call, with a fixed random output gradient, are
then replayed through both builds, which take turns --repeats times. Prints the medians, their
ratios, and how far the two builds' outputs and gradients are apart (relative to the largest).
The other revision's `cuda/cpu/` is taken with `git archive` and built under a name of its own
(cached in ~/.cache/turbogs/ab/REVISION); this tree's is the project's own build.

    python benchmarks/cpu_kernels_ab.py --base 4e1f7a0 [--scene ../shared/data/test_colmap] [-r 4]
        [--counts 10000 100000] [--repeats 7] [--threads 1]
"""

from __future__ import annotations

import argparse
import io
import re
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_native_step import KINDS  # noqa: E402

from turbogs import kernels  # noqa: E402
from turbogs.bench.step_trainer import trainer_at, without_points  # noqa: E402
from turbogs.data.load import load_scene  # noqa: E402
from turbogs.kernels import raster_cpu  # noqa: E402
from turbogs.kernels.turbo_cuda import build_module  # noqa: E402
from turbogs.training.config import get_preset  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def sources_at(revision: str, out: Path) -> Path:
    """cuda/cpu/ of a git revision, extracted under `out`."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "cuda/cpu"], check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(out, filter="data")
    return out / "cuda" / "cpu"


def captured_inputs(scene, kind: str, count: int, warmup: int, tmp: Path):
    """The arguments of the last rasterize call of a trainer's `warmup` steps."""
    preset, progress = KINDS[kind]
    calls = []
    original = raster_cpu.rasterize

    def recording(*args):
        calls.append(args)
        return original(*args)

    raster_cpu.rasterize = recording
    try:
        trainer = trainer_at(scene, get_preset(preset), count, progress, tmp)
        for _ in range(warmup):
            trainer.timed_step()
    finally:
        raster_cpu.rasterize = original
    return [x.detach().clone() if isinstance(x, torch.Tensor) else x for x in calls[-1]]


def replay(module, args, grads):
    """(forward ms, backward ms, [image, alpha, the four input gradients]) with `module`."""
    raster_cpu._state.update(module=module, tried=True)
    inputs = [x.clone().requires_grad_() if i < 4 else x for i, x in enumerate(args)]
    start = time.perf_counter()
    image, alpha = raster_cpu.rasterize(*inputs)
    middle = time.perf_counter()
    torch.autograd.backward([image, alpha], grads)
    end = time.perf_counter()
    return (middle - start) * 1e3, (end - middle) * 1e3, [image.detach(), alpha.detach()] + [x.grad for x in inputs[:4]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the git revision to compare this tree's kernels with")
    parser.add_argument("--scene", default="scenes/demo")
    parser.add_argument("-r", "--resolution", type=int, default=None)
    parser.add_argument("--counts", type=int, nargs="+", default=[10000])
    parser.add_argument("--kinds", nargs="+", default=["turbo full", "turbo 25%"], choices=list(KINDS))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kernels.use_torch_twins(False)
    if kernels.backend_name(torch.device("cpu")) != "cpu-native":
        raise SystemExit("the native CPU kernels could not be built here: nothing to compare")
    scene = without_points(load_scene(args.scene, resolution=args.resolution, eval_split=True, log=lambda *_: None))
    with TemporaryDirectory() as tmp:
        label = re.sub(r"\W", "_", args.base)  # a module and folder name, whatever the revision's spelling
        builds = {
            args.base: build_module().load_cpu_jit(source_dir=sources_at(args.base, Path(tmp) / "base"),
                                                   name=f"turbogs_cpu_ab_{label}",
                                                   build_dir=Path.home() / ".cache" / "turbogs" / "ab" / label),
            "this tree": raster_cpu.native_module(),  # the project's own build, cached as the trainer uses it
        }
        print(f"{args.scene} -r {args.resolution}, {args.threads} thread(s), torch {torch.__version__}; "
              f"medians of {args.repeats}, the builds taking turns")
        for count in args.counts:
            for kind in args.kinds:
                inputs = captured_inputs(scene, kind, count, args.warmup, Path(tmp))
                generator = torch.Generator().manual_seed(0)
                width, height = inputs[4], inputs[5]
                grads = [torch.randn(height, width, inputs[2].shape[1], generator=generator),
                         torch.randn(height, width, 1, generator=generator)]
                times = {name: ([], []) for name in builds}
                outputs = {}
                for turn in range(args.repeats + 1):
                    for name, module in builds.items():
                        forward, backward, outputs[name] = replay(module, inputs, grads)
                        if turn:  # the first turn warms the caches
                            times[name][0].append(forward)
                            times[name][1].append(backward)
                (base_f, base_b), (tree_f, tree_b) = [(statistics.median(f), statistics.median(b))
                                                      for f, b in times.values()]
                apart = max(float((x - y).abs().max() / y.abs().max().clamp_min(1e-30))
                            for x, y in zip(*outputs.values()))
                print(f"{count:>7} Gaussians  {kind:10s}  {args.base}: forward {base_f:6.1f} ms, backward "
                      f"{base_b:6.1f} ms | this tree: {tree_f:6.1f}, {tree_b:6.1f} | {args.base} / this tree: "
                      f"forward {base_f / tree_f:.2f}x, backward {base_b / tree_b:.2f}x, both "
                      f"{(base_f + base_b) / (tree_f + tree_b):.2f}x | outputs apart {apart:.1e}")


if __name__ == "__main__":
    main()
