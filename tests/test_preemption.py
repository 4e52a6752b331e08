"""Preemption loses nothing: SIGTERM and Ctrl-C (SIGINT) stop a run at a step every rank agrees
on, save the checkpoint and the model there, and `--resume` continues to the same model as an
uninterrupted run. A second signal during the save quits at once, and a write that fails (a full
disk, a read-only folder) is one line that leaves the previous checkpoint and model as they were."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from test_cli import small_demo
from test_distributed import model_values

from turbogs.cli import main
from turbogs.data.load import load_scene
from turbogs.distributed.world import LOCAL
from turbogs.formats import model_folder
from turbogs.training import checkpoint, session
from turbogs.training.config import get_preset
from turbogs.training.stop import REPEAT_WINDOW_SECONDS, QuitNow, StopAgreement, StopSignals
from turbogs.training.trainer import RANKS_READ_EVERY, SessionOptions

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
STEPS = 200  # long enough that a fast CPU is still running when the signal lands


def quiet(*_):
    pass


def send_to_self(signum: int) -> None:
    """Send this process `signum`, unless nothing catches it (it would end the test run)."""
    assert signal.getsignal(signum) not in (signal.SIG_DFL, signal.default_int_handler), "no stop handler installed"
    os.kill(os.getpid(), signum)


def temp_files(folder: Path):
    """What an interrupted atomic write would leave behind (fileio's hidden .tmp files)."""
    return [path for path in folder.rglob(".*") if ".tmp" in path.name]


# --- the parts ------------------------------------------------------------------------


def test_the_first_signal_asks_a_repeat_is_ignored_a_later_one_quits():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as signals:
        assert signals.received is None
        send_to_self(signal.SIGTERM)  # the handler runs at the next bytecode
        assert signals.received == signal.SIGTERM
        send_to_self(signal.SIGINT)  # within the window: the same request, delivered twice
        assert signals.received == signal.SIGTERM
        signals.repeat_window = 0.0
        with pytest.raises(QuitNow) as quit_now:
            send_to_self(signal.SIGINT)
            time.sleep(1)  # never reached in full: the handler raises
        assert quit_now.value.exit_code == 130 and "second SIGINT" in str(quit_now.value)
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored after the block


def test_one_process_decides_at_every_step_and_the_viewer_counts_too():
    class Viewer:
        stop_requested = False

    viewer, signals = Viewer(), StopSignals()
    stop = StopAgreement(LOCAL, signals, viewer, every=RANKS_READ_EVERY)
    assert stop.check(3) is None
    viewer.stop_requested = True
    request = stop.check(3)
    assert (request.reason, request.by_signal) == ("viewer", False)
    signals.received = signal.SIGTERM  # a signal outranks the viewer: it decides the exit code
    request = stop.check(4)
    assert (request.reason, request.by_signal, request.noticed_at) == ("SIGTERM", True, 4)


class SignalAt:
    """A stand-in for the live viewer that sends this process `signum` after step `step`: the
    signal comes from outside the loop, at a step the test knows."""

    stop_requested = False

    def __init__(self, step: int, signum: int = signal.SIGTERM):
        self.step, self.signum = step, signum

    def wait_if_paused(self, until):
        pass

    def update(self, step, total, stats, raw, view_error):
        if step == self.step:
            send_to_self(self.signum)


def train_in_process(scene_dir: Path, out: Path, steps: int, viewer=None, resume: bool = False) -> dict:
    scene = load_scene(str(scene_dir), eval_split=True, log=quiet)
    cfg = get_preset("3dgs").for_run(steps)
    cfg.seed = 2
    options = SessionOptions(out_dir=out, progress=False, log=quiet, viewer=viewer, resume=resume)
    return session.train(scene, cfg, options)


def test_a_signal_saves_the_step_it_came_in_and_resume_ends_bit_for_bit_equal(tmp_path):
    scene = small_demo(tmp_path, views=8)
    whole = train_in_process(scene, tmp_path / "whole", 30)

    out = tmp_path / "stopped"
    summary = train_in_process(scene, out, 30, viewer=SignalAt(11))
    assert summary["steps"] == 11 and summary["stopped_by"] == summary["signal"] == "SIGTERM"
    assert [step for step, _ in checkpoint.list_checkpoints(out)] == [11]  # the signal's step
    assert model_folder.latest_iteration(out) == 11
    assert model_folder.stopped_mark(out) == {"iteration": 11, "stopped_by": "SIGTERM", "progress": round(11 / 30, 4)}
    assert not (out / "results.json").exists()  # a signal's grace period is for saving, not scoring
    assert "psnr" not in summary

    resumed = train_in_process(scene, out, 30, resume=True)
    assert "stopped_by" not in resumed and model_folder.stopped_mark(out) is None
    assert list(out.glob("point_cloud/iteration_*")) == [out / "point_cloud" / "iteration_30"]
    np.testing.assert_array_equal(model_values(out), model_values(tmp_path / "whole"))
    assert resumed["psnr"] == whole["psnr"]


def test_a_signal_after_the_last_step_keeps_a_finished_model_and_skips_the_evaluation(tmp_path):
    out = tmp_path / "out"
    summary = train_in_process(small_demo(tmp_path, views=8), out, 12, viewer=SignalAt(12))
    assert summary["steps"] == 12 and summary["signal"] == "SIGTERM" and "stopped_by" not in summary
    assert model_folder.latest_iteration(out) == 12 and model_folder.stopped_mark(out) is None
    assert not (out / "results.json").exists()


def test_a_stopped_run_is_not_overwritten_by_a_new_one(tmp_path, capsys):
    scene = small_demo(tmp_path, views=8)
    out = tmp_path / "out"
    train_in_process(scene, out, 30, viewer=SignalAt(5, signal.SIGINT))
    code = main(["train", str(scene), "--out", str(out), "--preset", "3dgs", "--steps", "30", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "already holds a run stopped (SIGINT) at step 5, 17% done; use --resume to continue" in err


def test_a_second_signal_while_saving_quits_at_once_keeping_the_last_checkpoint(tmp_path, monkeypatch, capsys):
    """The first SIGTERM comes just after the periodic checkpoint of step 5, so the run stops at
    step 5 and saves it again; a second SIGTERM arrives halfway through that write."""
    scene = small_demo(tmp_path, views=8)
    out = tmp_path / "out"
    real_save, calls = torch.save, []

    def save(state, file):
        calls.append(state["step"])
        if len(calls) == 1:  # the periodic checkpoint, written in full; then the first signal
            real_save(state, file)
            send_to_self(signal.SIGTERM)
            return
        file.write(b"half a checkpoint")
        time.sleep(REPEAT_WINDOW_SECONDS + 0.2)  # past the window: not the same signal delivered twice
        send_to_self(signal.SIGTERM)
        time.sleep(30)  # a write that would go on; the second signal must end it at once

    monkeypatch.setattr(torch, "save", save)
    start = time.perf_counter()
    code = main(["train", str(scene), "--out", str(out), "--preset", "3dgs", "--steps", "30", "--eval", "--quiet",
                 "--checkpoint-every-steps", "5"])
    seconds = time.perf_counter() - start
    err = capsys.readouterr().err
    assert code == 143 and seconds < 20
    assert err.strip().splitlines() == ["turbogs train: second SIGTERM while saving: quit at once; "
                                        "the last complete checkpoint is kept"]
    assert calls == [5, 5]
    assert checkpoint.read_checkpoint(checkpoint.list_checkpoints(out)[0][1], 5)["step"] == 5  # the complete one
    assert not temp_files(out)
    assert model_folder.latest_iteration(out) is None and not (out / model_folder.STOPPED_MARK).exists()


# --- a real process ---------------------------------------------------------------------


def train_command(scene: Path, out: Path, *extra) -> list:
    return [sys.executable, "-m", "turbogs", "train", str(scene), "--out", str(out), "--preset", "3dgs",
            "--steps", str(STEPS), "--eval", "--seed", "1", "--quiet", "--threads", "1", *extra]


def signal_when_checkpointed(command: list, out: Path, target, signum: int, step: int) -> subprocess.CompletedProcess:
    """Start `command`, wait for its checkpoint of `step`, and send `signum` to `target(pid)`
    a tenth of a second later, so that the run is past that periodic checkpoint (and, at a few
    milliseconds a step on the native CPU kernels, not yet at its end)."""
    process = subprocess.Popen(command, env=ENV, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while step not in [s for s, _ in checkpoint.list_checkpoints(out)]:
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.05)
        time.sleep(0.1)
        assert process.poll() is None, "the run ended before the signal"
        os.kill(target(process.pid), signum)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def stopped_step(stdout: str, signame: str) -> int:
    ranks = r"(?: \(rank \d+, at step \d+\): every rank stops)?"  # with several ranks
    match = re.search(rf"^{signame}{ranks} at step (\d+); saving", stdout, re.M)
    assert match, stdout
    return int(match.group(1))


@pytest.mark.slow
def test_sigterm_to_a_process_saves_its_step_exits_143_and_resumes_to_the_same_model(tmp_path):
    scene = small_demo(tmp_path, views=8)
    whole = tmp_path / "whole"
    subprocess.run(train_command(scene, whole), check=True, env=ENV, cwd=REPO, capture_output=True, timeout=300)

    out = tmp_path / "stopped"
    result = signal_when_checkpointed(train_command(scene, out, "--checkpoint-every-steps", "20"), out,
                                      lambda pid: pid, signal.SIGTERM, 20)
    assert result.returncode == 143, result.stderr
    assert result.stderr.strip() == ""
    step = stopped_step(result.stdout, "SIGTERM")
    assert 20 < step < STEPS  # the signal's step, past the last periodic checkpoint
    # The stop's checkpoint and the last periodic one before it (the run may be past 40 by the time
    # the signal lands: a step of the native CPU kernels takes a few milliseconds here).
    assert [s for s, _ in checkpoint.list_checkpoints(out)] == [step, (step - 1) // 20 * 20]
    assert model_folder.latest_iteration(out) == step and model_folder.stopped_mark(out)["stopped_by"] == "SIGTERM"
    assert "the same command with --resume continues" in result.stdout

    resumed = subprocess.run(train_command(scene, out, "--resume"), env=ENV, cwd=REPO, capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from step {step} of {STEPS}" in resumed.stdout
    ply = model_folder.point_cloud_path
    assert ply(out, STEPS).read_bytes() == ply(whole, STEPS).read_bytes()
    a, b = (json.loads((folder / "results.json").read_text()) for folder in (whole, out))
    assert a["psnr"] == b["psnr"] and a["steps"] == b["steps"] == STEPS
    assert model_folder.stopped_mark(out) is None


def rank_1(launcher_pid: int) -> int:
    from test_distributed import rank_pid

    return rank_pid(launcher_pid, 1)


@pytest.mark.slow
@pytest.mark.parametrize("signame, target", [("SIGINT", "launcher"), ("SIGTERM", "rank 1")])
def test_a_signal_stops_two_ranks_at_one_step_and_they_resume_to_the_same_model(signame, target, tmp_path):
    """SIGINT to the launcher (what Ctrl-C in a terminal does: it passes the signal on to every
    rank), or SIGTERM to rank 1 alone (the other rank never got it): both ranks stop at the same
    step, the next where they compare stop flags; rank 0 saves it, and --resume continues."""
    scene = small_demo(tmp_path, views=8)
    common = ["--nproc", "2", "--checkpoint-every-steps", "20"]
    whole = tmp_path / "whole"
    done = subprocess.run(train_command(scene, whole, *common), env=ENV, cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr

    out = tmp_path / "stopped"
    signum = signal.Signals[signame]
    result = signal_when_checkpointed(train_command(scene, out, *common), out,
                                      (lambda pid: pid) if target == "launcher" else rank_1, signum, 20)
    assert result.returncode == 128 + signum, result.stderr
    assert "Traceback" not in result.stderr
    step = stopped_step(result.stdout, signame)
    assert step % RANKS_READ_EVERY == 0 and 20 < step < STEPS
    assert checkpoint.list_checkpoints(out)[0][0] == step and model_folder.latest_iteration(out) == step
    assert model_folder.stopped_mark(out)["stopped_by"] == signame

    resumed = subprocess.run(train_command(scene, out, *common, "--resume"), env=ENV, cwd=REPO, capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    np.testing.assert_array_equal(model_values(out), model_values(whole))
    a, b = (json.loads((folder / "results.json").read_text()) for folder in (whole, out))
    assert a["psnr"] == b["psnr"]


# --- a write that fails -----------------------------------------------------------------


@pytest.fixture
def mounts(tmp_path):
    """Mounts a test makes (root only), undone afterwards, newest first."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    made = []

    def mount(*args):
        try:
            result = subprocess.run(["mount", *map(str, args)], capture_output=True, text=True)
        except FileNotFoundError:
            pytest.skip("no mount command here")
        if result.returncode != 0:
            pytest.skip(f"cannot mount here: {result.stderr.strip()}")
        if args[-1] not in made:  # a remount changes a mount already made
            made.append(args[-1])

    yield mount
    for target in reversed(made):
        subprocess.run(["umount", "-l", str(target)], check=False)


@pytest.mark.parametrize("failure", ["disk full", "read-only"])
def test_a_failed_checkpoint_write_is_one_line_and_keeps_the_previous_files(failure, mounts, tmp_path, monkeypatch,
                                                                               capsys):
    """On a 32 MB disk, a finished model is in the folder; a new run (--overwrite) writes its
    first checkpoint, then the disk fills up (or the checkpoint folder turns read-only) before
    its second. Then, with room again, --resume continues."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounts("-t", "tmpfs", "-o", "size=32m", "tmpfs", disk)
    monkeypatch.setattr(session, "MIN_FREE_BYTES", 0)  # the 200 MB the preflight asks for do not fit a small disk
    monkeypatch.setattr(session, "disk_bytes_needed", lambda *args: 0)
    scene = small_demo(tmp_path, views=8)
    out = disk / "model"
    base = ["train", str(scene), "--out", str(out), "--preset", "3dgs", "--quiet"]
    assert main([*base, "--steps", "10"]) == 0
    old_model = model_folder.point_cloud_path(out, 10).read_bytes()
    capsys.readouterr()

    real_save = checkpoint.save_checkpoint

    def save_then_break_the_disk(model_dir, step, state):
        path = real_save(model_dir, step, state)
        if step == 5 and failure == "disk full":  # leave room for half a checkpoint
            room = os.statvfs(disk)
            (disk / "filler").write_bytes(b"\0" * (room.f_bavail * room.f_frsize - path.stat().st_size // 2))
        elif step == 5:  # the checkpoint folder alone, bound onto itself read-only
            mounts("--bind", path.parent, path.parent)
            mounts("-o", "remount,bind,ro", path.parent)
        return path

    monkeypatch.setattr(checkpoint, "save_checkpoint", save_then_break_the_disk)
    code = main([*base, "--steps", "40", "--overwrite", "--checkpoint-every-steps", "5"])
    err = capsys.readouterr().err
    assert code == 2
    reason = "No space left on device" if failure == "disk full" else "Read-only file system"
    assert len(err.strip().splitlines()) == 1 and "step_0000010.pt" in err and reason in err, err
    assert [step for step, _ in checkpoint.list_checkpoints(out)] == [5]
    assert checkpoint.read_checkpoint(checkpoint.list_checkpoints(out)[0][1], 5)["step"] == 5
    assert model_folder.latest_iteration(out) == 10 and model_folder.point_cloud_path(out, 10).read_bytes() == old_model
    assert not temp_files(out)

    if failure == "disk full":
        (disk / "filler").unlink()
    else:
        subprocess.run(["umount", str(out / "checkpoints")], check=True)
    assert main([*base, "--steps", "40", "--resume", "--checkpoint-every-steps", "5"]) == 0
    assert model_folder.latest_iteration(out) == 40 and not (out / "point_cloud" / "iteration_10").exists()
