"""Data-parallel training on CPU with gloo: ranks against one process of the same views.

The end-to-end tests start real ranks through `turbogs train --nproc 2` (torch.distributed's
elastic launcher, gloo), as a user would; the collectives are also tested on their own.
"""

import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from conftest import REPO
from plyfile import PlyData
from test_cli import DEMO

from turbogs.distributed.launch import rank_that_died, strip_nproc
from turbogs.distributed.multiview import ViewResult, combine
from turbogs.distributed.world import LOCAL, PeerStopped, World, exit_rank, parameter_checksum
from turbogs.errors import TurboGSError
from turbogs.training.config import get_preset

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def turbogs(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "turbogs", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=ENV)


def model_values(out: Path) -> np.ndarray:
    plys = sorted(out.glob("point_cloud/iteration_*/point_cloud.ply"))
    assert len(plys) == 1, plys  # one model, written once (by rank 0)
    vertex = PlyData.read(str(plys[0]))["vertex"].data
    return np.stack([vertex[name].astype(np.float64) for name in vertex.dtype.names], axis=1)


# --- end to end -----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("preset, steps", [("turbo", 80), ("3dgs", 260)])  # both densify in that many steps
def test_two_ranks_equal_one_process_of_two_views(preset, steps, tmp_path):
    common = [DEMO, "--preset", preset, "--steps", steps, "--eval", "--seed", "3", "--quiet"]
    ranks = turbogs("train", *common, "--nproc", 2, "--out", tmp_path / "ranks")
    assert ranks.returncode == 0, ranks.stderr
    batch = turbogs("train", *common, "--batch-views", 2, "--out", tmp_path / "batch")
    assert batch.returncode == 0, batch.stderr
    assert ranks.stdout.count("done:") == 1  # rank 0 alone speaks

    a, b = model_values(tmp_path / "ranks"), model_values(tmp_path / "batch")
    assert a.shape == b.shape  # the same Gaussians grew and were pruned
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    results = [json.loads((tmp_path / name / "results.json").read_text()) for name in ("ranks", "batch")]
    assert results[0]["psnr"] == pytest.approx(results[1]["psnr"], abs=1e-3)
    assert (results[0]["world_size"], results[0]["batch_views"]) == (2, 1)
    assert (results[1]["world_size"], results[1]["batch_views"]) == (1, 2)
    assert results[0]["steps"] == results[1]["steps"] == steps  # optimizer steps; views = steps x 2
    assert results[0]["num_gaussians"] != 3000 or preset == "turbo"  # 3dgs densified in this run


@pytest.mark.slow
def test_two_ranks_plan_the_same_sizes_in_a_budget_run(tmp_path):
    """Coarse to fine times a step on each rank, and every rank must switch sizes at the same step
    (the ranks sum the same Gaussians' gradients): the timings are rank 0's. A 288x512 capture
    (scenes/make_captures.py's `phone`) starts small; the ranks compare a checksum of the parameters
    every 100 steps and stop on a difference, so a run that ends ends agreed."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_captures_ranks", REPO / "scenes" / "make_captures.py")
    captures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(captures)
    scene = captures.make_capture("phone", str(tmp_path))
    result = turbogs("train", scene, "--nproc", 2, "--budget-seconds", 20, "--eval", "--quiet", "--out", tmp_path / "ranks")
    assert result.returncode == 0, result.stderr
    sizes = json.loads((tmp_path / "ranks" / "results.json").read_text())["training_sizes"]
    assert len(sizes) > 1 and sizes[0]["factor"] > 1 and sizes[-1]["factor"] == 1, sizes
    assert sum(size["steps"] for size in sizes) >= 100  # past a checksum comparison


def rank_pid(launcher_pid: int, rank: int) -> int:
    """The pid of a rank started (directly or not) by `launcher_pid`, found by its environment."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == launcher_pid:
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            if f"RANK={rank}".encode() in environ and b"TORCHELASTIC_RUN_ID" in b"\0".join(environ):
                stat = (entry / "stat").read_text().split()
                if int(stat[3]) == launcher_pid:
                    return int(entry.name)
        except OSError:
            continue
    raise AssertionError(f"no rank {rank} under pid {launcher_pid}")


@pytest.mark.slow
def test_a_killed_rank_stops_the_run_with_a_clear_error_and_it_resumes(tmp_path):
    out = tmp_path / "run"
    launcher = subprocess.Popen([sys.executable, "-m", "turbogs", "train", str(DEMO), "--preset", "3dgs", "--eval",
                                 "--steps", "5000", "--nproc", "2", "--checkpoint-every-steps", "10", "--quiet",
                                 "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        deadline = time.time() + 300
        while not list((out / "checkpoints").glob("*.pt")) and time.time() < deadline:
            assert launcher.poll() is None, launcher.communicate()
            time.sleep(0.5)
        os.kill(rank_pid(launcher.pid, 1), signal.SIGKILL)
        stdout, stderr = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 2, stderr
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "rank 1" in lines[0] and "SIGKILL" in lines[0] and "--resume" in lines[0]

    # The checkpoint continues, on another number of ranks (one process here).
    resumed = turbogs("train", DEMO, "--preset", "3dgs", "--eval", "--steps", "40", "--resume", "--quiet", "--out", out)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from step" in resumed.stdout
    assert json.loads((out / "results.json").read_text())["world_size"] == 1
    model_values(out)


def test_more_views_per_step_than_the_capture_has_is_one_clear_line(tmp_path):
    result = turbogs("train", DEMO, "--steps", "2", "--batch-views", "40", "--out", tmp_path / "x")
    assert result.returncode == 2
    assert "40 views per step" in result.stderr and "Traceback" not in result.stderr


# --- the collectives, two gloo processes -------------------------------------------------


def _collectives(rank: int, init_file: str, results) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    world = World(rank, 2, rank, "gloo")
    summed = world.all_reduce(torch.tensor([1.0, rank + 1.0]))
    maxed = world.all_reduce(torch.tensor([float(rank), -float(rank)]), "max")
    gathered = world.all_gather(torch.tensor([rank * 10.0]))
    pair = (torch.tensor([0.1, rank + 1.0, 1e8 * (rank + 1)]), torch.tensor([float(rank), -float(rank)]))
    world.reduce_sum_and_max(*pair)
    no_max = torch.tensor([rank + 0.5])
    world.reduce_sum_and_max(no_max, torch.zeros(0))
    world.check_same(torch.tensor([1.0, 2.0]), "a constant")
    outcome = {"summed": summed.tolist(), "maxed": maxed.tolist(), "gathered": [g.item() for g in gathered],
               "pair": [pair[0].tolist(), pair[1].tolist(), no_max.tolist()],
               "floats": world.gather_floats([float(rank), 0.5 + rank])}
    try:
        world.check_same(torch.tensor([float(rank)]), "the rank number")
    except TurboGSError as exc:
        outcome["check"] = (type(exc).__name__, str(exc))
    try:
        world.agree(TurboGSError("bad capture") if rank == 1 else None)
    except TurboGSError as exc:
        outcome["agree"] = (type(exc).__name__, str(exc))
    results[rank] = outcome
    world.close()
    exit_rank(0)  # past libtorch's C++ teardown, where a gloo rank can abort (see exit_rank)


def test_collectives_sum_gather_compare_and_agree(tmp_path):
    results = mp.Manager().dict()
    mp.spawn(_collectives, args=(str(tmp_path / "init"), results), nprocs=2, join=True)
    for rank in (0, 1):
        assert results[rank]["summed"] == [2.0, 3.0]
        assert results[rank]["maxed"] == [1.0, 0.0]
        assert results[rank]["gathered"] == [0.0, 10.0]
        assert results[rank]["floats"] == [[0.0, 0.5], [1.0, 1.5]]
        # rank 0's values plus rank 1's, in float32 as an all-reduce adds them; the max, and a sum with no max
        sums = (torch.tensor([0.1, 1.0, 1e8]) + torch.tensor([0.1, 2.0, 2e8])).tolist()
        assert results[rank]["pair"] == [sums, [1.0, 0.0], [2.0]]
        assert "ranks disagree on the rank number" in results[rank]["check"][1]
    # Rank 0 reports (a plain error, naming the rank that failed); rank 1 stops quietly.
    assert results[0]["check"][0] == "TurboGSError" and results[1]["check"][0] == "PeerStopped"
    assert results[0]["agree"] == ("TurboGSError", "rank 1: bad capture")
    assert results[1]["agree"][0] == "PeerStopped" and PeerStopped.quiet


def _three_ranks(rank: int, init_file: str, results) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=3)
    world = World(rank, 3, rank, "gloo")
    # 1, 1e8 and -1e8 held by the ranks in every order: in float32, 1e8 + 1 rounds back to 1e8, so
    # each order of adding gives its own pattern of 0s and 1s
    orders = list(itertools.permutations([1.0, 1e8, -1e8]))
    summed = torch.tensor([order[rank] for order in orders] + [float(rank)])
    maxed = torch.tensor([float(rank == 1)])
    world.reduce_sum_and_max(summed, maxed)
    no_max = torch.tensor([order[rank] for order in orders])
    world.reduce_sum_and_max(no_max, torch.zeros(0))
    results[rank] = {"summed": summed.tolist(), "maxed": maxed.tolist(), "no_max": no_max.tolist(),
                     "gathered": [g.tolist() for g in world.all_gather(torch.tensor([rank, -rank]))]}
    world.close()
    exit_rank(0)


def test_three_ranks_add_in_rank_order_and_gather_in_it():
    """On gloo the ranks exchange their buffers and each adds them up itself (World.reduce_sum_and_max):
    the order is the ranks', so every rank holds the same bits."""
    results = mp.Manager().dict()
    with tempfile.TemporaryDirectory() as scratch:
        mp.spawn(_three_ranks, args=(os.path.join(scratch, "init"), results), nprocs=3, join=True)
    in_rank_order = [float((torch.tensor(a) + torch.tensor(b)) + torch.tensor(c))
                     for a, b, c in itertools.permutations([1.0, 1e8, -1e8])]
    assert sorted(set(in_rank_order)) == [0.0, 1.0]  # the orders differ
    for rank in range(3):
        assert results[rank]["summed"] == in_rank_order + [3.0]
        assert results[rank]["maxed"] == [1.0]
        assert results[rank]["no_max"] == in_rank_order
        assert results[rank]["gathered"] == [[0, 0], [1, -1], [2, -2]]


def test_one_process_is_a_world_of_one():
    tensor = torch.tensor([1.0, 2.0])
    assert LOCAL.all_reduce(tensor) is tensor and LOCAL.all_gather(tensor) == [tensor]
    assert LOCAL.broadcast_float(3.5) == 3.5 and LOCAL.gather_floats([1.0, 2.0]) == [[1.0, 2.0]]
    LOCAL.check_same(tensor, "anything")
    with pytest.raises(TurboGSError, match="bad"):
        LOCAL.agree(TurboGSError("bad"))


def test_parameter_checksum_sees_any_change():
    params = [torch.randn(5, 3), torch.randn(5)]
    before = parameter_checksum(params)
    params[1][2] += 1e-6
    assert not torch.equal(before, parameter_checksum(params))


# --- the pieces of a step of several views -------------------------------------------------


def test_combine_averages_the_views_of_a_step():
    views = [ViewResult(torch.tensor(1.0), torch.tensor(20.0), torch.tensor([True, False, False]), torch.tensor([0.5]),
                        statistics={"grad2d": torch.tensor([1.0, 1.0, 0.0]), "radii": torch.tensor([4.0, 0.0, 5.0])}),
             ViewResult(torch.tensor(3.0), torch.tensor(float("nan")), torch.tensor([False, False, True]),
                        torch.tensor([0.1, 0.2]),
                        statistics={"grad2d": torch.tensor([0.0, 2.0, 2.0]), "radii": torch.tensor([0.0, 1.0, 3.0])})]
    step = combine(views, LOCAL, [], {"radii": "max"}, [1, 2], batch_views=2)
    assert step.loss.item() == 2.0  # the mean loss of the views
    assert step.psnr.item() == 20.0  # the mean over the views that have a PSNR
    assert step.visible.tolist() == [True, False, True]
    assert [e.tolist() for e in step.tile_errors] == [[0.5], pytest.approx([0.1, 0.2])]
    assert step.statistics["grad2d"].tolist() == [1.0, 3.0, 2.0]  # summed over the views
    assert step.statistics["radii"].tolist() == [4.0, 1.0, 5.0]  # a "max" statistic: the largest


def test_a_run_of_several_views_per_step_is_scheduled_in_views():
    single = get_preset("3dgs").for_run(1000)
    double = get_preset("3dgs").for_run(500, world_size=2)
    assert double.steps == 500 and double.world_size == 2
    for name in ("densify_from", "densify_until", "densify_every", "opacity_reset_every"):
        assert getattr(double.density, name) == getattr(single.density, name) // 2, name
    assert double.lr.means == pytest.approx(single.lr.means * 2 ** 0.5)  # the sqrt rule
    assert double.optimizer == single.optimizer  # "sqrt" leaves the optimizer's own settings
    none = get_preset("3dgs")
    none.batch_lr_rule = "none"
    assert none.for_run(500, world_size=2).lr.means == single.lr.means
    assert get_preset("turbo").for_run(500, world_size=2).density.densify_every == 50


@pytest.mark.parametrize("preset", ["3dgs", "turbo", "turbo+optimizer-hybrid"])
def test_grendels_rule_counts_the_optimizers_averages_in_views(preset):
    """Grendel-GS's rule for V views per step: rates x sqrt(V), every decay b -> b^V (so that a
    moving average remembers as many views), eps / sqrt(V)."""
    single = get_preset(preset).for_run(1200)
    cfg = get_preset(preset)
    cfg.batch_views, cfg.batch_lr_rule = 3, "grendel"
    triple = cfg.for_run(400)
    assert triple.lr.sh0 == pytest.approx(single.lr.sh0 * 3 ** 0.5)
    assert triple.optimizer.betas == pytest.approx(tuple(beta ** 3 for beta in single.optimizer.betas))
    assert triple.optimizer.eps == pytest.approx(single.optimizer.eps / 3 ** 0.5)
    for name in type(single.optimizer).view_decays:  # the hybrid's curvature average
        assert getattr(triple.optimizer, name) == pytest.approx(getattr(single.optimizer, name) ** 3), name
    assert "hybrid" not in preset or type(single.optimizer).view_decays == ("hessian_beta",)
    assert get_preset(preset).batch_lr_rule == {"turbo": "grendel", "3dgs": "sqrt"}[preset.split("+")[0]]  # measured
    from turbogs.cli import build_parser
    from turbogs.training.config import BATCH_LR_RULES
    train_parser = build_parser()._subparsers._group_actions[0].choices["train"]
    [choices] = [action.choices for action in train_parser._actions if "--batch-lr" in action.option_strings]
    assert tuple(choices) == BATCH_LR_RULES  # the CLI spells the rules out (it imports no config)
    # A constant gradient: after k steps of 3 views the first moment holds what 3k single-view
    # steps leave, because (b^3)^k = b^(3k); with the betas per step it would not.
    def first_moment(optimizer_config, steps):
        param = torch.zeros(1, 3, requires_grad=True)
        optimizer = optimizer_config.build({"means": param}, {"means": 0.1})["means"]
        for _ in range(steps):
            param.grad = torch.ones(1, 3)
            optimizer.step()
        return optimizer.state[param]["exp_avg"]

    assert torch.allclose(first_moment(single.optimizer, 12), first_moment(triple.optimizer, 4), rtol=1e-6)
    assert not torch.allclose(first_moment(single.optimizer, 12), first_moment(single.optimizer, 4), rtol=1e-3)


def test_a_resumed_run_takes_its_own_optimizer_settings_not_the_checkpoints(tmp_path):
    """A checkpoint of 1 view per step resumed with 2 views per step: the optimizers keep the
    saved moments but take this run's rates and decays (torch's load_state_dict alone would
    bring back the saved ones)."""
    from test_cli import small_demo

    from turbogs.data.load import load_scene
    from turbogs.training.trainer import SessionOptions, Trainer

    scene = load_scene(small_demo(tmp_path, views=4), eval_split=False, log=lambda message: None)
    options = SessionOptions(out_dir=tmp_path, progress=False, log=lambda message: None)
    first = Trainer(scene, get_preset("3dgs").for_run(steps=20), options)
    for _ in range(3):
        first.timed_step()
    state = {**first.state_dict(), "step": first.step}  # what checkpoint.save_checkpoint writes
    cfg = get_preset("3dgs")
    cfg.batch_views, cfg.batch_lr_rule = 2, "grendel"
    resumed = Trainer(scene, cfg.for_run(steps=10), options)
    resumed.load_state_dict(state)
    group = resumed.optimizers["opacities"].param_groups[0]
    assert group["lr"] == pytest.approx(first.optimizers["opacities"].param_groups[0]["lr"] * 2 ** 0.5)
    assert group["betas"] == pytest.approx((0.9 ** 2, 0.999 ** 2))
    saved = first.optimizers["opacities"].state[first.gaussians.params["opacities"]]["exp_avg"]
    assert torch.equal(resumed.optimizers["opacities"].state[resumed.gaussians.params["opacities"]]["exp_avg"], saved)


def test_the_launcher_drops_nproc_from_the_workers_command():
    assert strip_nproc(["train", "s", "--nproc", "2", "--steps", "5"]) == ["train", "s", "--steps", "5"]
    assert strip_nproc(["train", "s", "--nproc=4"]) == ["train", "s"]


def test_the_launcher_names_a_rank_that_died_not_one_it_stopped():
    """The ranks' exit codes as torch's launcher reports them (ProcessFailure's fields)."""
    from types import SimpleNamespace

    def failed(*exits):  # each rank's (exit code, time), in rank order
        return {rank: SimpleNamespace(exitcode=code, timestamp=time, pid=100 + rank)
                for rank, (code, time) in enumerate(exits)}

    term, kill = -signal.SIGTERM, -signal.SIGKILL
    # Rank 1 said why (exit code 2) and the launcher then stopped rank 0: nothing to name.
    assert rank_that_died(failed((term, 2), (2, 1))) is None
    # Rank 1 was killed; rank 0, stopped by the launcher after it, is not the cause.
    rank, failure = rank_that_died(failed((term, 1), (kill, 2)))
    assert (rank, failure.pid) == (1, 101)
    # A crash (exit code 1) is named even when another rank said why.
    assert rank_that_died(failed((2, 1), (1, 2)))[0] == 1
    # Only SIGTERMs (the user stopped a rank): the earliest is named.
    assert rank_that_died(failed((term, 3), (term, 2)))[0] == 1
    # The ranks stopped on a signal and saved the run (128 + its number): they said why, and so
    # did a rank the launcher then stopped with SIGTERM.
    assert rank_that_died(failed((143, 1), (143, 2))) is None
    assert rank_that_died(failed((130, 1), (term, 2))) is None


class StopButton:
    """Rank 0's live viewer, as the trainer sees it: the stop button is pressed at step 5."""

    stop_requested = False

    def wait_if_paused(self, until):
        pass

    def update(self, step, total, stats, raw, view_error):
        self.stop_requested = step >= 5


def _stop_from_the_viewer(rank: int, init_file: str, out: str, results) -> None:
    from turbogs.data.load import load_scene
    from turbogs.training.session import train
    from turbogs.training.trainer import SessionOptions

    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    world = World(rank, 2, rank, "gloo")
    scene = load_scene(str(DEMO))
    cfg = get_preset("3dgs").for_run(50, world_size=2)
    options = SessionOptions(out_dir=Path(out), progress=False, evaluate=False, log=lambda message: None, world=world,
                         viewer=StopButton() if rank == 0 else None)
    summary = train(scene, cfg, options)
    results[rank] = (summary["steps"], summary.get("stopped_by"))
    exit_rank(0)  # train() left the group; skip the C++ teardown that can abort a gloo rank


def test_rank_0s_viewer_stops_every_rank_at_the_same_step(tmp_path):
    """Pressed at step 5, the Stop reaches rank 1 at the next step where the ranks compare
    their stop flags (every RANKS_READ_EVERY steps), and both stop there."""
    from turbogs.training.trainer import RANKS_READ_EVERY

    results = mp.Manager().dict()
    mp.spawn(_stop_from_the_viewer, args=(str(tmp_path / "init"), str(tmp_path / "out"), results), nprocs=2, join=True)
    assert results[0] == results[1] == (RANKS_READ_EVERY, "viewer")
    assert len(list((tmp_path / "out").glob(f"point_cloud/iteration_{RANKS_READ_EVERY}/point_cloud.ply"))) == 1


@pytest.mark.slow
def test_torchrun_starts_the_same_ranks(tmp_path):
    """What a multi-machine run does on each machine: torchrun's own command line, `-m turbogs`."""
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             "-m", "turbogs", "train", str(DEMO), "--steps", "6", "--quiet", "--out", str(tmp_path / "run")],
                            capture_output=True, text=True, timeout=300, env=ENV)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("done: 6 steps") == 1 and "x 2 ranks (gloo)" in result.stdout
    model_values(tmp_path / "run")


def test_a_rank_ends_with_its_code_after_the_exit_handlers_and_flushed_output():
    """exit_rank skips libtorch's C++ teardown (a gloo rank can abort there) but nothing Python
    would do at exit is lost: atexit handlers run, buffered output arrives, the code is kept."""
    program = ("import atexit, sys\n"
               "from turbogs.distributed.world import exit_rank\n"
               "atexit.register(lambda: print('handler ran'))\n"
               "sys.stdout.write('buffered ')\n"
               "exit_rank(3)\n"
               "print('never')\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "buffered handler ran\n"
