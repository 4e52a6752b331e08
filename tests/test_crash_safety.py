"""Crash safety: a torn checkpoint falls back to the one before, a run killed with SIGKILL
resumes to the same model as an uninterrupted one, and one output folder has one writer."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_cli import small_demo

from turbogs.cli import main
from turbogs.data.load import load_scene
from turbogs.training import checkpoint
from turbogs.training.config import get_preset
from turbogs.training.outdir import exclusive_output
from turbogs.training.trainer import SessionOptions, Trainer

REPO = Path(__file__).resolve().parents[1]
# Long enough that the kill, at most 1.5 s after the first checkpoint (at 0.5 s), lands in training:
# with the native CPU kernels 80 steps took 1 s and the run could finish first; 600 take about 7 s.
STEPS = 600


def quiet(*_):
    pass


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    for step in (10, 20):
        checkpoint.save_checkpoint(tmp_path, step, {"params": {"means": torch.full((2, 3), float(step))}})
    newest = checkpoint.list_checkpoints(tmp_path)[0][1]
    newest.write_bytes(newest.read_bytes()[:40])  # torn mid-write
    warnings = []
    state = checkpoint.load_latest_checkpoint(tmp_path, warn=warnings.append)
    assert state["step"] == 10 and torch.equal(state["params"]["means"], torch.full((2, 3), 10.0))
    assert len(warnings) == 1 and str(newest) in warnings[0]


def test_only_the_newest_two_checkpoints_are_kept(tmp_path):
    for step in (1, 2, 3):
        checkpoint.save_checkpoint(tmp_path, step, {"params": {}})
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path)] == [3, 2]


def test_turbo_state_round_trip_resumes_bit_for_bit(tmp_path):
    """Everything random or remembered (RNGs, view order, sampler, error memory, density state,
    optimizer moments) is in the checkpoint: a resumed run equals an uninterrupted one."""
    scene = load_scene(small_demo(tmp_path, views=4), eval_split=False, log=quiet)
    cfg = get_preset("turbo").for_run(steps=24)
    cfg.density.densify_every = 5
    options = SessionOptions(out_dir=tmp_path, progress=False, log=quiet)
    whole = Trainer(scene, cfg, options)
    while whole.progress() < 1.0:
        whole.timed_step()
    first = Trainer(scene, cfg, options)
    for _ in range(11):
        first.timed_step()
    path = checkpoint.save_checkpoint(tmp_path / "ckpt", first.step, first.state_dict())
    torch.manual_seed(12345)  # the global RNG state must come from the checkpoint, not the process
    resumed = Trainer(scene, cfg, options)
    resumed.load_state_dict(torch.load(path, weights_only=False))
    while resumed.progress() < 1.0:
        resumed.timed_step()
    for name, value in whole.gaussians.raw().items():
        assert torch.equal(value, resumed.gaussians.raw()[name]), name


def test_a_checkpoint_from_before_a_density_statistic_existed_resumes_with_it_at_zero(tmp_path):
    """A checkpoint written before error-driven density kept its "fade" statistic (older
    versions) resumes: the missing statistic starts at zero, one row per Gaussian, and the
    run goes on through a densification."""
    scene = load_scene(small_demo(tmp_path, views=4), eval_split=False, log=quiet)
    cfg = get_preset("turbo").for_run(steps=24)
    cfg.density.densify_every = 5
    options = SessionOptions(out_dir=tmp_path, progress=False, log=quiet)
    first = Trainer(scene, cfg, options)
    for _ in range(7):
        first.timed_step()
    state = torch.load(checkpoint.save_checkpoint(tmp_path / "ckpt", first.step, first.state_dict()), weights_only=False)
    state["density"] = {k: v for k, v in state["density"].items() if k != "fade"}
    resumed = Trainer(scene, cfg, options)
    resumed.load_state_dict(state)
    assert torch.equal(resumed.density_state["fade"], torch.zeros(len(resumed.gaussians)))
    assert torch.equal(resumed.density_state["blame"], first.density_state["blame"])
    while resumed.progress() < 1.0:
        resumed.timed_step()
    assert all(len(value) == len(resumed.gaussians) for value in resumed.density_state.values())


def train_args(scene: Path, out: Path, *extra: str):
    return [sys.executable, "-m", "turbogs", "train", str(scene), "--out", str(out), "--preset", "3dgs",
            "--steps", str(STEPS), "--eval", "--seed", "1", "--quiet", "--threads", "1", *extra]


@pytest.mark.slow
def test_kill_9_then_resume_matches_an_uninterrupted_run(tmp_path):
    scene = small_demo(tmp_path, views=8)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    whole = tmp_path / "whole"
    subprocess.run(train_args(scene, whole), check=True, env=env, cwd=REPO, capture_output=True, timeout=120)

    killed = tmp_path / "killed"
    process = subprocess.Popen(train_args(scene, killed, "--checkpoint-every", "0.5"), env=env, cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not checkpoint.list_checkpoints(killed) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert checkpoint.list_checkpoints(killed), "no checkpoint appeared"
        time.sleep(random.Random(7).uniform(0.0, 1.5))
        assert process.poll() is None, "the run ended before it could be killed"
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == -signal.SIGKILL
    assert not (killed / "results.json").exists()

    resumed = subprocess.run(train_args(scene, killed, "--resume"), env=env, cwd=REPO, capture_output=True,
                             text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from step" in resumed.stdout
    a = json.loads((whole / "results.json").read_text())
    b = json.loads((killed / "results.json").read_text())
    print(f"uninterrupted PSNR {a['psnr']:.4f} dB, killed+resumed PSNR {b['psnr']:.4f} dB")
    assert a["steps"] == b["steps"] == STEPS
    assert abs(a["psnr"] - b["psnr"]) < 0.1


def test_a_second_run_into_a_locked_folder_refuses_in_one_line(tmp_path, capsys):
    scene = small_demo(tmp_path, views=4)
    out = tmp_path / "out"
    out.mkdir()
    with exclusive_output(out):  # the first run, holding the lock
        code = main(["train", str(scene), "--out", str(out), "--preset", "3dgs", "--steps", "2", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert "another turbogs run is writing into this folder" in err and len(err.strip().splitlines()) == 1
    assert not (out / "point_cloud").exists()
    # Released: now the same command runs.
    assert main(["train", str(scene), "--out", str(out), "--preset", "3dgs", "--steps", "2", "--quiet"]) == 0
