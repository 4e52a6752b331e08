"""Preflight: the memory estimate against independent counts, a refusal that names the flags
that help, out-of-memory during training saving a checkpoint, and output-folder checks."""

import errno
import os
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from test_cli import small_demo

import turbogs.training.outdir as outdir
from turbogs.cli import main
from turbogs.data.load import load_scene
from turbogs.errors import TurboGSError
from turbogs.gaussians import Gaussians
from turbogs.training import checkpoint, preflight
from turbogs.training.config import get_preset
from turbogs.training.trainer import Trainer


def quiet(*_):
    pass


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    path = small_demo(tmp_path_factory.mktemp("pre"), views=8)
    return path, load_scene(path, eval_split=True, log=quiet)


def test_params_per_gaussian_matches_the_container():
    for degree in (0, 3):
        g = Gaussians.from_points(torch.rand(5, 3), torch.rand(5, 3), degree)
        assert preflight.params_per_gaussian(degree) == sum(v.numel() for v in g.raw().values()) // 5
    assert preflight.params_per_gaussian(3) == 59


def test_estimate_counts_the_loaded_images_and_the_gaussian_cap(demo):
    _, scene = demo
    cfg = get_preset("3dgs").for_run(steps=10)
    estimate = preflight.estimate_memory(scene, cfg, torch.device("cpu"))
    assert estimate.images == sum(c.image.nbytes for c in scene.train + scene.test)
    assert estimate.num_gaussians == len(scene.points)  # uncapped INRIA rule: the initial count
    assert estimate.gaussians == len(scene.points) * 59 * 4 * 4
    cfg.background_points = 0.5  # the start holds them too
    with_background = len(scene.points) + round(0.5 * len(scene.points))
    assert preflight.estimate_memory(scene, cfg, torch.device("cpu")).num_gaussians == with_background
    cfg.density.max_gaussians = 50_000
    assert preflight.estimate_memory(scene, cfg, torch.device("cpu")).num_gaussians == 50_000
    split = preflight.estimate_memory(scene, cfg, torch.device("cuda"), torch.device("cpu")).per_device()
    assert split["cpu"] == estimate.images and split["cuda"] > 0


def test_meminfo_is_parsed(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  1000 kB\nMemFree:  10 kB\nMemAvailable:   2048 kB\n")
    assert preflight.cpu_available_bytes(meminfo) == 2048 * 1024
    assert preflight.cpu_available_bytes(tmp_path / "missing") is None


def test_a_run_that_cannot_fit_is_refused_in_one_line(demo, tmp_path, capsys):
    path, scene = demo
    cfg = get_preset("turbo").for_run(steps=10)
    preflight.check_memory(scene, cfg, torch.device("cpu"), max_memory_bytes=2**40)  # fits
    code = main(["train", str(path), "--out", str(tmp_path / "o"), "--steps", "5", "--quiet", "--max-memory", "0.01"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "not enough cpu memory" in err and "-r 2/4/8" in err and "--max-gaussians" in err
    assert not (tmp_path / "o").exists()  # refused before anything was written
    # On a GPU with the images there too, keeping them on the CPU is advice as well.
    estimate = preflight.estimate_memory(scene, cfg, torch.device("cuda"))
    assert "--data-device cpu" in preflight.memory_message(estimate, "cuda", 2**31, 2**30)


def test_data_device_cpu_keeps_images_off_the_compute_device(demo, tmp_path):
    _, scene = demo
    from turbogs.training.trainer import SessionOptions

    trainer = Trainer(scene, get_preset("3dgs").for_run(steps=4), SessionOptions(
        out_dir=tmp_path, progress=False, log=quiet, data_device=torch.device("cpu")))
    trainer.timed_step()
    assert all(image.device.type == "cpu" for image in trainer.train_views.images)


def test_out_of_memory_saves_a_checkpoint_and_exits_2(demo, tmp_path, monkeypatch, capsys):
    path, _ = demo
    real = Trainer.train_step

    def train_step(self):
        if self.step == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        real(self)

    monkeypatch.setattr(Trainer, "train_step", train_step)
    out = tmp_path / "oom"
    code = main(["train", str(path), "--out", str(out), "--preset", "3dgs", "--steps", "10", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "out of cpu memory at step 3" in err and "--resume" in err and "--max-gaussians" in err
    state = checkpoint.load_latest_checkpoint(out, warn=quiet)
    assert state is not None and state["step"] == 3


def test_output_folder_checks(tmp_path, monkeypatch):
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(TurboGSError, match="is a file"):
        outdir.check_output_dir(afile)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(10**9, 10**9 - 5 * 2**20, 5 * 2**20))
    with pytest.raises(TurboGSError, match="only 5 MiB free"):
        outdir.check_output_dir(tmp_path / "full")
    monkeypatch.undo()
    # Root writes through chmod, so a read-only folder is simulated at the two checks it meets:
    # os.access (permission bits, read-only mounts) and the write probe (everything else).
    monkeypatch.setattr(os, "access", lambda *_: False)
    with pytest.raises(TurboGSError, match="not writable"):
        outdir.check_output_dir(tmp_path / "ro1")
    monkeypatch.undo()

    def refuse(self, data):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(Path, "write_bytes", refuse)
    with pytest.raises(TurboGSError, match="not writable .Read-only file system"):
        outdir.check_output_dir(tmp_path / "ro2")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a chmod 0500 folder")
def test_chmod_read_only_folder_is_refused(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(TurboGSError, match="not writable"):
            outdir.check_output_dir(folder)
    finally:
        folder.chmod(0o700)
