"""Side by side in one process: turbo's quarter (and full) step with the old sampled PSNR and blame gathers
(80fa64f's, loaded from a worktree) against the new, alternating step by step."""
import importlib.util, statistics, sys, time, torch
from pathlib import Path
from tempfile import TemporaryDirectory
import turbogs.training.trainer as trainer_mod
import turbogs.density.error_driven as ed
from turbogs.bench.step_trainer import trainer_at, without_points
from turbogs.data.load import load_scene
from turbogs.device import keep_freed_memory
from turbogs.formats.model_folder import load_gaussians
from turbogs.training.config import get_preset
keep_freed_memory(); torch.set_num_threads(1)
def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path); m = importlib.util.module_from_spec(spec); sys.modules[name] = m; spec.loader.exec_module(m); return m
old_metrics = load("old_metrics", "/work/wt50/turbogs/metrics.py")
old_ed = load("old_ed", "/work/wt50/turbogs/density/error_driven.py")
versions = {"old": (old_metrics.sampled_psnr_tensor, old_ed.tile_blame_term),
            "new": (trainer_mod.sampled_psnr_tensor, ed.tile_blame_term)}
def use(v):
    trainer_mod.sampled_psnr_tensor, ed.tile_blame_term = versions[v]
scene_path, r, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]
counts = [int(c) for c in sys.argv[4].split(",")]
scene = without_points(load_scene(scene_path, resolution=r, eval_split=True, log=lambda *_: None))
start = load_gaussians(Path(model), torch.device("cpu"))[0]
with TemporaryDirectory() as tmp:
    for count in counts:
        res = {}
        for kind, p in (("full", 0.1), ("25%", 0.7)):
            trs = {v: trainer_at(scene, get_preset("turbo"), count, p, Path(tmp) / f"{count}{kind}{v}", start=start) for v in versions}
            times = {v: [] for v in versions}
            for i in range(3 + 15):
                for v, tr in trs.items():
                    use(v); t = time.perf_counter(); tr.timed_step(); dt = time.perf_counter() - t
                    if i >= 3: times[v].append(dt)
            for v in versions:
                res[(kind, v)] = statistics.median(times[v]) * 1e3
        print(f"{count} Gaussians: " + ", ".join(f"{k} {v} {t:.1f} ms" for (k, v), t in res.items())
              + f"; 25%/full old {res[('25%','old')]/res[('full','old')]:.3f}, new {res[('25%','new')]/res[('full','new')]:.3f}", flush=True)
