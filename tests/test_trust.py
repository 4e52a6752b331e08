"""Trust boundaries: no file TurboGS opens runs code, and a viewer open to the network is
read-only unless --viewer-control says otherwise.

- Checkpoints are loaded as data only. A crafted one whose unpickling would create a
  marker file is refused with one line and exit code 2, and the marker never appears;
  the payload is shown to be live by loading a twin of it the unsafe way.
- Checkpoints written the way TurboGS always wrote them still resume.
- `view`, `eval`, `render` and `export` of a hostile model folder run nothing from it.
- Off loopback, the viewer's server refuses Pause/Resume/Stop, even as clicks forged over
  viser's websocket (a disabled button is only a hint to honest browsers).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from test_cli import small_demo
from test_viewer import _viser_client, scene_camera, write_blob_model
from turbogs.viewer import LiveViewer, serve_model
from turbogs.viewer.model_files import load_model as load_viewer_model
from turbogs.viewer.server import is_loopback

from turbogs.cli import main
from turbogs.data.load import load_scene
from turbogs.errors import InputError, TurboGSError
from turbogs.formats.model_folder import read_cfg_args
from turbogs.training import checkpoint
from turbogs.training.config import get_preset
from turbogs.training.trainer import SessionOptions, Trainer


def quiet(*_):
    pass


class CreatesFile:
    """Unpickling this creates `path` (pickle calls open(path, "w")): a stand-in for any code."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def write_crafted_checkpoint(model_dir: Path, step: int, marker: Path) -> Path:
    """A checkpoint that looks like TurboGS's (format, step, params) plus one hostile object."""
    path = checkpoint.checkpoint_dir(model_dir) / f"step_{step:07d}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"format": checkpoint.FORMAT_VERSION, "step": step, "params": {"means": torch.zeros(2, 3)},
                "payload": CreatesFile(marker)}, path)
    return path


def test_the_crafted_payload_is_live_when_unpickled_unsafely(tmp_path):
    """Without this, the refusal tests below could pass with a payload that does nothing."""
    marker = tmp_path / "ran"
    path = write_crafted_checkpoint(tmp_path, 10, marker)
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_resume_refuses_a_crafted_checkpoint_in_one_line_and_runs_nothing(tmp_path, capsys):
    scene = small_demo(tmp_path, views=4)
    out, marker = tmp_path / "out", tmp_path / "MARKER"
    crafted = write_crafted_checkpoint(out, 10, marker)
    code = main(["train", str(scene), "--out", str(out), "--preset", "3dgs", "--steps", "20", "--resume", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(crafted) in lines[0] and "refused" in lines[0] and "io.open" in lines[0], lines[0]
    assert not marker.exists()
    assert not (out / "point_cloud").exists()  # nothing trained on, nothing written
    assert crafted.exists()  # and the evidence is left where it was


def test_a_refused_newest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    marker = tmp_path / "MARKER"
    checkpoint.save_checkpoint(tmp_path, 10, {"params": {"means": torch.ones(2, 3)}})
    crafted = write_crafted_checkpoint(tmp_path, 20, marker)
    warnings = []
    state = checkpoint.load_latest_checkpoint(tmp_path, warn=warnings.append)
    assert state["step"] == 10 and torch.equal(state["params"]["means"], torch.ones(2, 3))
    assert len(warnings) == 1 and str(crafted) in warnings[0] and "refused" in warnings[0]
    assert "trying the previous one" in warnings[0]
    assert not marker.exists()


def test_every_checkpoint_unusable_is_one_error(tmp_path):
    write_crafted_checkpoint(tmp_path, 20, tmp_path / "MARKER")
    torn = checkpoint.checkpoint_dir(tmp_path) / "step_0000010.pt"
    torn.write_bytes(b"PK\x03\x04 torn")
    warnings = []
    with pytest.raises(TurboGSError, match="cannot resume: checkpoint .*step_0000010.pt is unreadable"):
        checkpoint.load_latest_checkpoint(tmp_path, warn=warnings.append)
    assert len(warnings) == 1 and "refused" in warnings[0]
    assert not (tmp_path / "MARKER").exists()
    assert checkpoint.load_latest_checkpoint(tmp_path / "empty", warn=warnings.append) is None  # none at all


def test_a_bare_pickle_named_like_a_checkpoint_is_refused(tmp_path):
    """Not a torch zip archive at all: the legacy path of torch.load must not unpickle it either."""
    import pickle

    marker = tmp_path / "MARKER"
    path = checkpoint.checkpoint_dir(tmp_path) / "step_0000010.pt"
    path.parent.mkdir(parents=True)
    path.write_bytes(pickle.dumps({"format": 1, "step": 10, "params": {}, "x": CreatesFile(marker)}))
    with pytest.raises(TurboGSError, match="refused"):
        checkpoint.load_latest_checkpoint(tmp_path, warn=quiet)
    assert not marker.exists()


@pytest.mark.parametrize("preset", ["3dgs", "turbo"])
def test_an_old_format_checkpoint_still_resumes(tmp_path, capsys, preset):
    """Written exactly as TurboGS wrote checkpoints before the safe loader (a plain
    torch.save of the trainer's state), mid-run, then resumed through the CLI."""
    scene_dir = small_demo(tmp_path, views=4)
    out = tmp_path / "out"
    scene = load_scene(scene_dir, eval_split=False, log=quiet)
    trainer = Trainer(scene, get_preset(preset).for_run(steps=12), SessionOptions(out_dir=out, progress=False, log=quiet))
    for _ in range(5):
        trainer.timed_step()
    path = checkpoint.checkpoint_dir(out) / "step_0000005.pt"
    path.parent.mkdir(parents=True)
    torch.save({"format": 1, "step": trainer.step, **trainer.state_dict()}, path)
    assert checkpoint.read_checkpoint(path, 5)["step"] == 5  # every field is plain data

    code = main(["train", str(scene_dir), "--out", str(out), "--preset", preset, "--steps", "12", "--resume", "--quiet"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "resuming from step 5 of 12" in captured.out
    assert "warning" not in captured.out
    assert (out / "point_cloud" / "iteration_12" / "point_cloud.ply").is_file()


# --- model folders from elsewhere ------------------------------------------------------

HOSTILE_CFG_ARGS = [
    "Namespace(source_path=__import__('os').system('touch {marker}'), images='images')",
    "Namespace(sh_degree=3)or(__import__('os').system('touch {marker}'))",
    "Namespace(**{{'source_path': open('{marker}', 'w')}})",
    "Namespace(sh_degree=3, images=[c for c in ().__class__.__base__.__subclasses__()])",
]


@pytest.mark.parametrize("text", HOSTILE_CFG_ARGS)
def test_a_hostile_cfg_args_is_refused_and_runs_nothing(tmp_path, text):
    marker = tmp_path / "MARKER"
    path = tmp_path / "cfg_args"
    path.write_text(text.format(marker=marker))
    with pytest.raises(InputError, match="unreadable cfg_args"):
        read_cfg_args(path)
    assert not marker.exists()


@pytest.mark.parametrize("text", HOSTILE_CFG_ARGS[:2])
def test_view_eval_render_export_of_a_hostile_model_folder_run_nothing(tmp_path, capsys, text):
    """A model folder from elsewhere: a hostile cfg_args, a crafted checkpoint, and a
    Python file. eval and render need the capture cfg_args names: they refuse in one line.
    export and view need only the .ply and cameras.json: they work. Nothing runs."""
    marker = tmp_path / "MARKER"
    model = write_blob_model(tmp_path)
    (model / "cfg_args").write_text(text.format(marker=marker))
    write_crafted_checkpoint(model, 500, marker)
    (model / "__init__.py").write_text(f"open({str(marker)!r}, 'w')\n")
    for command in (["eval", model], ["render", model]):
        code = main([str(a) for a in command])
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1 and "unreadable cfg_args" in err, err
    assert main(["export", str(model), "-o", str(tmp_path / "copy.ply")]) == 0
    loaded = load_viewer_model(model)
    assert loaded.num_gaussians == 600 and len(loaded.cameras) == 1
    assert loaded.cameras[0].thumbnail is None  # the images cfg_args would have named are not looked for
    assert not marker.exists()


# --- the viewer off loopback -----------------------------------------------------------


def test_loopback_is_recognised_by_address_not_by_spelling():
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "no-such-host.invalid"):
        assert not is_loopback(host), host


def click(ws, button) -> None:
    """What a browser sends when a button is clicked, whether or not its UI allows it."""
    import msgspec
    from viser import _messages

    ws.send(msgspec.msgpack.encode(_messages.GuiUpdateMessage(button._impl.uuid, {"value": True}).as_serializable_dict()))


def wait_until(condition, timeout: float = 5.0) -> bool:
    deadline = time.time() + timeout
    while not condition() and time.time() < deadline:
        time.sleep(0.02)
    return condition()


def connect(viewer: LiveViewer):
    ws = _viser_client(viewer.server.port)  # it binds 0.0.0.0, so loopback reaches it too
    assert wait_until(viewer.server.clients), "the test client never registered"
    return ws


def test_off_loopback_the_server_refuses_forged_pause_and_stop(tmp_path):
    logged = []
    viewer = LiveViewer([scene_camera()], host="0.0.0.0", port=18640, refresh_seconds=0.2, log=logged.append)
    try:
        assert any("read-only" in m and "--viewer-control" in m and "0.0.0.0" in m for m in logged), logged
        assert viewer.pause_button.disabled and viewer.stop_button.disabled
        ws = connect(viewer)
        for _ in range(3):
            click(ws, viewer.pause_button)
            click(ws, viewer.stop_button)
        assert wait_until(lambda: any("refused" in m for m in logged))
        time.sleep(0.5)  # time for any click that were to get through
        assert not viewer.paused and not viewer.stop_requested
        refusals = [m for m in logged if "refused" in m]
        assert len(refusals) == 1 and "pause training" in refusals[0] and "--viewer-control" in refusals[0], refusals
        ws.close()
    finally:
        viewer.close()


@pytest.mark.parametrize("host, control, button, done, startup", [
    # The same forged click works with --viewer-control: the refusal above is the gate, not a broken click.
    ("0.0.0.0", True, "stop_button", "stop_requested", "--viewer-control lets any of them pause, resume or stop training"),
    ("127.0.0.1", False, "pause_button", "paused", None),  # on loopback nothing changes: no warning, controls on
], ids=["viewer-control", "loopback"])
def test_allowed_clicks_act(host, control, button, done, startup):
    logged = []
    viewer = LiveViewer([scene_camera()], host=host, port=18660, refresh_seconds=0.2, log=logged.append,
                        control=control)
    try:
        if startup is None:
            assert not any("WARNING" in m or "read-only" in m for m in logged), logged
        else:
            assert any(startup in m for m in logged), logged
        assert viewer.server.control_allowed and not getattr(viewer, button).disabled
        ws = connect(viewer)
        click(ws, getattr(viewer, button))
        assert wait_until(lambda: getattr(viewer, done))
        assert not any("refused" in m for m in logged), logged
        ws.close()
    finally:
        viewer.close()


def test_a_read_only_model_viewer_writes_no_screenshots(tmp_path):
    """`turbogs view --host 0.0.0.0`: a browser cannot make this machine write files."""
    logged = []
    model = write_blob_model(tmp_path)
    server = serve_model(model, host="0.0.0.0", port=18700, block=False, log=logged.append)
    try:
        assert any("read-only" in m and "save screenshots" in m for m in logged), logged
        button = next(h for h in server.viser.gui._gui_input_handle_from_uuid.values()
                      if getattr(h, "label", None) == "Save screenshot")
        assert button.disabled
        ws = _viser_client(server.port)
        click(ws, button)
        assert wait_until(lambda: any("refused" in m for m in logged))
        assert any("refused a request to save a screenshot" in m for m in logged), logged
        assert not list(model.glob("screenshot_*.png"))
        ws.close()
    finally:
        server.close()
