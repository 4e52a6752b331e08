"""`turbogs bench`: the side-by-side run, its files, the speedup maths, --set, and the step cost.

One small bench on the demo scene (128x96, 10 steps, two presets) is shared by several
tests. Its evaluation is made slower on purpose, to see that evaluation time never
reaches the training clock.
"""

import json
import math
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from turbogs import bench
from turbogs.bench import race as bench_race
from turbogs.cli import main as turbogs_main
from turbogs.evaluate import evaluate_views
from turbogs.gaussians import Gaussians, num_sh_bases
from turbogs.training.config import PRESETS, preset_3dgs

REPO = Path(__file__).resolve().parents[1]
DEMO = str(REPO / "scenes" / "demo")
EVAL_SLEEP = 0.6  # seconds added to every evaluation in the shared run


@pytest.fixture(scope="module")
def demo_bench(tmp_path_factory):
    """`turbogs bench` on the demo scene with a second name for the 3dgs preset; every
    evaluation sleeps EVAL_SLEEP seconds. Returns the run's facts."""
    out = tmp_path_factory.mktemp("bench")
    calls = []

    def slow_evaluate(*args, **kwargs):
        calls.append(time.perf_counter())
        time.sleep(EVAL_SLEEP)
        return evaluate_views(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(PRESETS, "3dgs_again", preset_3dgs)
        mp.setattr(bench_race, "evaluate_views", slow_evaluate)  # where run_preset looks it up
        started = time.perf_counter()
        code = turbogs_main(["bench", DEMO, "--presets", "3dgs,3dgs_again", "-r", "1", "--steps", "10", "--eval-points", "2",
                           "--device", "cpu", "--quiet", "--out", str(out)])
        wall = time.perf_counter() - started
    assert code == 0
    return {"out": out, "result": json.loads((out / "bench.json").read_text()), "wall": wall, "evaluations": len(calls)}


def test_bench_json_has_every_preset_with_points_memory_and_speed(demo_bench):
    result = demo_bench["result"]
    assert result["command"].startswith("turbogs bench ") and "--steps 10" in result["command"]
    assert result["device"] == "cpu" and result["mode"] == {"steps": 10}
    assert result["image_size"] == [128, 96] and result["test_views"] == 4 and result["train_views"] == 28
    assert set(result["machine"]) >= {"platform", "python", "torch", "cpu_count"}
    assert list(result["presets"]) == ["3dgs", "3dgs_again"]
    for entry in result["presets"].values():
        points = entry["points"]
        assert [p["step"] for p in points] == [0, 5, 10]  # the start, then every N/K steps
        assert points[0]["seconds"] == 0.0
        assert all(a["seconds"] < b["seconds"] for a, b in zip(points, points[1:]))
        for p in points:
            assert 0 < p["psnr"] < 60 and 0 < p["ssim"] <= 1 and p["num_gaussians"] > 0
        assert entry["steps"] == 10 and entry["stopped_by"] == "steps"
        assert entry["train_seconds"] == pytest.approx(points[-1]["seconds"], abs=1e-3)
        assert entry["steps_per_second"] == pytest.approx(10 / entry["train_seconds"], rel=1e-2)
        assert entry["memory_measure"] == "cpu_rss_growth"
        assert isinstance(entry["peak_memory_bytes"], int) and entry["peak_memory_bytes"] >= 0
        assert entry["num_gaussians"] == points[-1]["num_gaussians"]
    # Same scene load, same seed, same recipe: the same quality at every point.
    first, second = (result["presets"][n]["points"] for n in ("3dgs", "3dgs_again"))
    assert [p["psnr"] for p in first] == pytest.approx([p["psnr"] for p in second], abs=1e-6)
    pair = result["speedup"]["3dgs"]["3dgs_again"]
    assert set(pair) == {"target_psnr", "threshold_psnr", "seconds", "reference_seconds", "speedup",
                         "reference_run_seconds", "speedup_vs_run"}
    assert pair["target_psnr"] == pytest.approx(second[-1]["psnr"])
    assert set(result["speedup"]["3dgs_again"]) == {"3dgs"}


def test_evaluation_time_is_not_training_time(demo_bench):
    result = demo_bench["result"]
    assert demo_bench["evaluations"] == 6  # 3 per preset
    trained = sum(entry["train_seconds"] for entry in result["presets"].values())
    # Had the sleeping evaluations been counted, training time would be nearly the wall time.
    assert trained + demo_bench["evaluations"] * EVAL_SLEEP <= demo_bench["wall"]


def test_plot_and_markdown_are_written(demo_bench):
    out = demo_bench["out"]
    image = cv2.imread(str(out / "psnr_vs_time.png"))
    assert image is not None and image.shape == (bench.PLOT_SIZE[1], bench.PLOT_SIZE[0], 3)
    for color in bench.CURVE_COLORS[:2]:  # one curve per preset, in its color
        assert (np.abs(image.astype(int) - color).sum(axis=-1) < 30).sum() > 50
    assert (image < 128).all(axis=-1).sum() > 500  # axes, ticks and labels in black
    report = (out / "bench.md").read_text()
    assert "| 3dgs | " in report and "| 3dgs_again | " in report and "--steps 10" in report
    assert not list(out.glob(".*.tmp*")), "a temporary file of an atomic write was left behind"


def points(*pairs):
    return [{"seconds": s, "psnr": p} for s, p in pairs]


def test_time_to_psnr_interpolates_between_points():
    curve = points((0, 10.0), (10, 20.0), (20, 24.0))
    assert bench.time_to_psnr(curve, 23.9) == pytest.approx(np.interp(23.9, [10.0, 20.0, 24.0], [0, 10, 20]))
    assert bench.time_to_psnr(curve, 15.0) == pytest.approx(5.0)
    assert bench.time_to_psnr(curve, 9.0) == 0.0  # already there at the start
    assert bench.time_to_psnr(curve, 24.5) is None  # never
    dip = points((0, 12.0), (10, 8.0), (20, 16.0), (30, 14.0))
    assert bench.time_to_psnr(dip, 14.0) == pytest.approx(10 + (14 - 8) / (16 - 8) * 10)  # first crossing


def test_speedups_compare_each_ordered_pair():
    fast = points((0, 10.0), (10, 20.0), (20, 24.0))
    slow = points((0, 10.0), (30, 22.0), (60, 25.0))
    result = bench.speedups({"fast": fast, "slow": slow}, tolerance=0.1)
    # fast never comes within 0.1 dB of slow's final 25 dB.
    assert result["fast"]["slow"]["target_psnr"] == 25.0
    assert result["fast"]["slow"]["seconds"] is None and result["fast"]["slow"]["speedup"] is None
    # slow reaches 23.9 dB (fast's final - 0.1) at 30 + 1.9/3 * 30 s; fast at 10 + 3.9/4 * 10 s.
    entry = result["slow"]["fast"]
    assert entry["threshold_psnr"] == pytest.approx(23.9)
    assert entry["seconds"] == pytest.approx(30 + 1.9 / 3 * 30)
    assert entry["reference_seconds"] == pytest.approx(10 + 3.9 / 4 * 10)
    assert entry["speedup"] == pytest.approx((10 + 3.9 / 4 * 10) / (30 + 1.9 / 3 * 30))
    assert entry["reference_run_seconds"] == 20 and entry["speedup_vs_run"] == pytest.approx(20 / (30 + 1.9 / 3 * 30))


def test_speedup_vs_run_is_stable_when_the_reference_touches_its_final_early():
    """A reference whose curve touches its final level early, dips and ends there gives a
    first-crossing speedup near 1 however slow it is; against its whole run the ratio says
    how much sooner the other preset has the same result."""
    bumpy = points((0, 8.0), (10, 17.0), (20, 15.0), (150, 17.0))
    quick = points((0, 8.0), (5, 12.0), (10, 18.0), (150, 19.0))
    entry = bench.speedups({"quick": quick, "bumpy": bumpy}, tolerance=0.1)["quick"]["bumpy"]
    t = 5 + (16.9 - 12.0) / 6.0 * 5
    assert entry["seconds"] == pytest.approx(t)
    assert entry["speedup"] == pytest.approx(10 * (16.9 - 8) / 9 / t)  # bumpy first got there at ~9.9 s
    assert entry["speedup_vs_run"] == pytest.approx(150 / t)


def test_budget_mode_stops_on_the_training_clock(tmp_path):
    budget = 1.5
    code = turbogs_main(["bench", DEMO, "--presets", "3dgs", "-r", "1", "--budget-seconds", str(budget), "--eval-points", "3",
                       "--device", "cpu", "--quiet", "--out", str(tmp_path)])
    assert code == 0
    entry = json.loads((tmp_path / "bench.json").read_text())["presets"]["3dgs"]
    assert entry["stopped_by"] == "budget" and entry["max_steps"] == 30_000
    step_time = entry["train_seconds"] / entry["steps"]
    assert budget <= entry["train_seconds"] < budget + 5 * step_time + 0.5
    seconds = [p["seconds"] for p in entry["points"]]
    assert seconds[0] == 0.0 and len(seconds) == 4
    for mark, actual in zip([0.5, 1.0, 1.5], seconds[1:]):  # each evaluation once its mark has passed
        assert mark <= actual < mark + 5 * step_time + 0.5


def test_a_preset_with_its_own_step_count_races_a_time_budget(tmp_path):
    """`turbo,3dgs@N`: turbo runs the bench's time budget, 3dgs exactly N steps (its
    schedules scaled to N, no budget), and the speedup against 3dgs's whole run is there:
    the shape of the paper's claim against "3DGS at 7k steps"."""
    code = turbogs_main(["bench", DEMO, "--presets", "turbo,3dgs@12", "-r", "1", "--budget-seconds", "1", "--eval-points", "2",
                       "--device", "cpu", "--quiet", "--out", str(tmp_path)])
    assert code == 0
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["mode"] == {"budget_seconds": 1.0, "preset_steps": {"3dgs@12": 12}}
    turbo, vanilla = result["presets"]["turbo"], result["presets"]["3dgs@12"]
    assert turbo["stopped_by"] == "budget" and turbo["train_seconds"] >= 1.0
    assert vanilla["stopped_by"] == "steps" and vanilla["steps"] == vanilla["max_steps"] == 12
    assert [p["step"] for p in vanilla["points"]] == [0, 6, 12]  # evaluations every N/K steps
    pair = result["speedup"]["turbo"]["3dgs@12"]
    assert pair["reference_run_seconds"] == pytest.approx(vanilla["train_seconds"], abs=1e-3)
    assert "3dgs@12 runs 12 steps instead" in (tmp_path / "bench.md").read_text()


def test_set_changes_the_config_the_bench_trains_with_and_is_recorded(demo_bench, tmp_path):
    """`--set` on the scene form: the settings reach the trainer (a half share of background
    points starts the run from 1.5x the capture's points, densification every 20 steps shows in
    the Gaussian count), and bench.json and bench.md say which settings ran."""
    code = turbogs_main(["bench", f"demo={DEMO}:r=1", "--presets", "3dgs", "--steps", "120", "--eval-points", "3",
                         "--set", "background_points=0.5", "--set", "density.densify_every=20",
                         "--device", "cpu", "--quiet", "--out", str(tmp_path)])
    assert code == 0
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["settings"] == ["background_points=0.5", "density.densify_every=20"]
    assert result["resolution"] == 1 and result["scene_name"] == "demo" and result["image_size"] == [128, 96]
    entry = result["presets"]["3dgs"]
    assert entry["config"]["background_points"] == 0.5 and entry["config"]["density"]["densify_every"] == 20
    assert entry["config"]["density"]["kind"] == "3dgs" and entry["config"]["steps"] == 120
    plain = demo_bench["result"]["presets"]["3dgs"]  # the same preset and scene without the settings
    assert plain["config"]["background_points"] == 0.0 and not demo_bench["result"]["settings"]
    start = entry["points"][0]["num_gaussians"]
    assert start == round(1.5 * plain["points"][0]["num_gaussians"])
    # The count over the run, read through the StepObserver: the start, then densifications that
    # the evaluation points agree with.
    counts = entry["gaussian_counts"]
    assert counts[0] == {"step": 0, "seconds": 0.0, "num_gaussians": start}
    grown = [event for event in counts[1:] if event.get("n_cloned", 0) + event.get("n_split", 0) > 0]
    assert grown and all(event["step"] % 20 == 0 for event in grown)
    assert entry["peak_gaussians"] == max(event["num_gaussians"] for event in counts) > start
    for point in entry["points"]:
        assert point["num_gaussians"] == [e for e in counts if e["step"] <= point["step"]][-1]["num_gaussians"]
    report = (tmp_path / "bench.md").read_text()
    assert report.startswith("# TurboGS bench: demo")
    assert "- settings on every preset: `background_points=0.5`, `density.densify_every=20`" in report
    assert "## Gaussian count over the run" in report


def test_step_cost_renders_the_asked_share_of_tiles(tmp_path):
    code = turbogs_main(["bench", DEMO, "--presets", "3dgs", "-r", "1", "--step-cost", "--step-cost-repeats", "1",
                       "--step-cost-gaussians", "2000", "--step-cost-profile", "--set", "sh_degree=2",
                       "--device", "cpu", "--out", str(tmp_path)])
    assert code == 0
    cost = json.loads((tmp_path / "step_cost.json").read_text())
    assert cost["num_gaussians"] == 2000 and cost["settings"] == ["sh_degree=2"]
    assert [f["fraction"] for f in cost["fractions"]] == [1.0, 0.5, 0.25]
    assert [f["tiles"] for f in cost["fractions"]] == [48, 24, 12]  # of 8 x 6 tiles
    assert all(f["seconds_per_step"] > 0 and len(f["all_seconds"]) == 1 for f in cost["fractions"])
    assert cost["ratio_to_full"]["1.0"] == 1.0
    assert cost["ratio_to_full"]["0.25"] == pytest.approx(
        cost["fractions"][2]["seconds_per_step"] / cost["fractions"][0]["seconds_per_step"], rel=1e-3)
    # The profile: render + loss + backward at both shares, and whole training steps at two points
    # of a run from as many Gaussians.
    profile = (tmp_path / "profile.txt").read_text()
    assert "== 100% of tiles" in profile and "== 25% of tiles" in profile
    for share in ("10%", "70%"):
        assert f"== one whole training step (3dgs, at {share} of a 1000-step run, from 2000 Gaussians" in profile


def test_random_tile_mask_has_exactly_the_share():
    generator = torch.Generator().manual_seed(0)
    for fraction, expected in [(1.0, 48), (0.5, 24), (0.25, 12), (0.3, math.ceil(0.3 * 48)), (0.001, 1)]:
        mask = bench.random_tile_mask(6, 8, fraction, generator)
        assert mask.shape == (6, 8) and mask.dtype == torch.bool and int(mask.sum()) == expected


def test_replicated_gaussians_keep_the_coverage():
    n, count = 50, 400
    g = torch.Generator().manual_seed(0)
    params = {"means": torch.randn(n, 3, generator=g), "scales": torch.randn(n, 3, generator=g) - 3,
              "quats": torch.randn(n, 4, generator=g), "opacities": torch.randn(n, generator=g),
              "sh0": torch.randn(n, 1, 3, generator=g), "shN": torch.randn(n, num_sh_bases(1) - 1, 3, generator=g)}
    base = Gaussians(params, sh_degree=1, active_sh_degree=1)
    clones = bench.replicated_gaussians(base, count, torch.Generator().manual_seed(1))
    assert len(clones) == count and clones.sh_degree == 1
    # Every clone is a base row with its log-scales shrunk by log((count / n)^(1/3)).
    shrink = math.log(count / n) / 3
    raw = clones.raw()
    matches = (raw["quats"][:, None] == params["quats"][None]).all(-1)
    rows = matches.float().argmax(dim=1)
    assert matches.any(dim=1).all()
    assert torch.allclose(raw["scales"], params["scales"][rows] - shrink, atol=1e-5)
    assert torch.equal(raw["sh0"], params["sh0"][rows])
    offsets = (raw["means"] - params["means"][rows]) / params["scales"][rows].exp()
    assert 0.7 < float(offsets.std()) < 1.3  # jittered by about one base standard deviation


def test_nice_ticks():
    assert bench.nice_ticks(0, 57) == [0, 10, 20, 30, 40, 50, 60]
    assert bench.nice_ticks(4.9, 15.3) == [4, 6, 8, 10, 12, 14, 16]
    assert bench.nice_ticks(0.0, 0.5) == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    assert bench.nice_ticks(0, 150.14) == [0, 50, 100, 150]  # a budget run's overshoot adds no tick
    assert bench.nice_ticks(0, 151) == [0, 50, 100, 150, 200]
    ticks = bench.nice_ticks(20.0, 20.0)  # a flat curve still gets an axis
    assert ticks[0] < 20.0 < ticks[-1]


@pytest.mark.parametrize("argv, message", [
    (["--presets", "nope", "--steps", "5"], "unknown preset 'nope'"),
    (["--presets", "3dgs,3dgs", "--steps", "5"], "listed twice"),
    (["--presets", "turbo+no-such-part", "--steps", "5"], "unknown ablation 'no-such-part'"),
    (["--presets", "3dgs@7k", "--steps", "5"], "'3dgs@7k': the steps after '@' must be a whole number"),
    (["--presets", "3dgs@0", "--steps", "5"], "'3dgs@0': the steps after '@' must be a whole number of at least 1"),
    (["--presets", "nope@5", "--steps", "5"], "unknown preset 'nope'"),
    (["--presets", "3dgs"], "--budget-seconds S or --steps N"),
    (["--presets", "3dgs", "--steps", "5", "--step-cost"], "--step-cost"),
    (["--presets", "3dgs", "--steps", "5", "--set", "density.no_such_field=1"],
     "setting 'density.no_such_field=1': density (VanillaDensityConfig) has no field 'no_such_field'"),
    (["--presets", "3dgs,turbo", "--steps", "5", "--set", "density.opacity_decay=0.5"],  # error-driven's, not 3dgs's
     "has no field 'opacity_decay'"),
    (["--presets", "3dgs", "--steps", "5", "--set", "density=bogus"], "no density named 'bogus'"),
    (["--presets", "3dgs", "--steps", "5", "--set", "seed=x"], "'x' is not a Python literal"),
    (["--presets", "3dgs", "--step-cost", "--set", "nope=1"], "TrainConfig has no field 'nope'"),
])
def test_bad_flags_are_one_line_errors(argv, message, tmp_path, capsys):
    code = turbogs_main(["bench", DEMO, *argv, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and "\n" not in err and err.startswith("turbogs bench: error:")


def test_ablation_presets_switch_one_part_off():
    """"turbo+PART" is turbo with exactly one field changed, the same change as the train flag."""
    from dataclasses import asdict

    from turbogs.density.vanilla import VanillaDensityConfig
    from turbogs.optim.base import AdamConfig
    from turbogs.training.config import get_preset

    def described(cfg) -> dict:  # the density and optimizer settings named by their kind
        data = asdict(cfg)
        data["density"] = {"kind": cfg.density.name, **data["density"]}
        data["optimizer"] = {"kind": cfg.optimizer.name, **data["optimizer"]}
        return data

    turbo = described(get_preset("turbo"))
    changed = {
        "turbo+no-sparse": {("sampler", "fraction_start"): 1.0, ("sampler", "fraction_end"): 1.0},
        "turbo+no-ncc": {("tile_loss", "lambda_ncc"): 0.0},
        "turbo+density-3dgs": {("density",): {"kind": "3dgs", **asdict(VanillaDensityConfig())}},
        "turbo+optimizer-adam": {("optimizer",): {"kind": "adam", **asdict(AdamConfig())}},
        "turbo+optimizer-hybrid": {("optimizer",): turbo["optimizer"]},  # turbo's already
    }
    for name, fields in changed.items():
        variant = described(get_preset(name))
        assert variant.pop("preset") == name
        expected = {**turbo}
        expected.pop("preset")
        expected = {key: dict(value) if isinstance(value, dict) else value for key, value in expected.items()}
        for path, value in fields.items():
            if len(path) == 1:
                expected[path[0]] = value
            else:
                expected[path[0]][path[1]] = value
        assert variant == expected, name


@pytest.mark.parametrize("scene, flags, message", [
    (f"{DEMO}:r8", [], "unknown option ':r8'"),
    (f"{DEMO}:r=2", ["-r", "4"], "the scene says r=2 and -r says 4"),
    (f"{DEMO}:density.max_gaussians=10", [], "give settings with --set, not in the scene"),
])
def test_a_bad_scene_form_is_a_one_line_error(scene, flags, message, tmp_path, capsys):
    code = turbogs_main(["bench", scene, *flags, "--presets", "3dgs", "--steps", "5", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and "\n" not in err and err.startswith("turbogs bench: error:")


def test_missing_scene_is_a_one_line_error(tmp_path, capsys):
    code = turbogs_main(["bench", str(tmp_path / "nowhere"), "--presets", "3dgs", "--steps", "5", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "nowhere" in err and "does not exist" in err and "\n" not in err
