"""The web viewer without a browser: model loading, splat math, binding, the live viewer's
cost and controls, and a websocket client that vanishes mid-stream."""

from __future__ import annotations

import json
import math
import re
import socket
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from turbogs.viewer import LiveViewer, ViewerServer, serve_model
from turbogs.viewer.cameras import read_cameras_json
from turbogs.viewer.heatmap import error_overlay
from turbogs.viewer.model_files import load_model
from turbogs.viewer.server import find_free_port
from turbogs.viewer.gpu_render import (
    camera_from_viewer,
    gaussians_from_params,
    maybe_add_server_rendering,
    render_rgb,
)
from turbogs.viewer.splats import splats_from_params

from turbogs.data.scene import Camera
from turbogs.errors import InputError, TurboGSError
from turbogs.formats.ply import write_ply
from turbogs.gaussians import SH_C0
from turbogs.geometry import quat_to_rotmat

# --- fixtures: a blob model in front of one camera ------------------------------------

# The fixture camera sits at the origin looking down +z (OpenCV axes); a red blob is on
# its left and a blue blob on its right, 3 units ahead.
CAMERA_W, CAMERA_H, CAMERA_F = 320, 240, 300.0
BLOBS = {"red": ((-0.6, 0.0, 3.0), (1.0, 0.05, 0.05)), "blue": ((0.6, 0.0, 3.0), (0.05, 0.05, 1.0))}


def blob_params(per_blob: int = 300, seed: int = 0) -> dict:
    """Pre-activation params of two colored Gaussian blobs (numpy, SH degree 1)."""
    rng = np.random.default_rng(seed)
    means, colors = [], []
    for center, color in BLOBS.values():
        means.append(np.asarray(center) + 0.12 * rng.standard_normal((per_blob, 3)))
        colors.append(np.tile(color, (per_blob, 1)))
    means = np.concatenate(means).astype(np.float32)
    n = means.shape[0]
    quats = rng.standard_normal((n, 4)).astype(np.float32)
    return {
        "means": means,
        "scales": np.full((n, 3), math.log(0.05), np.float32),
        "quats": quats,
        "opacities": np.full(n, 3.0, np.float32),  # sigmoid(3) = 0.95
        "sh0": ((np.concatenate(colors) - 0.5) / SH_C0).astype(np.float32)[:, None, :],
        "shN": np.zeros((n, 3, 3), np.float32),
    }


def camera_entry(name: str = "view_000") -> dict:
    """INRIA cameras.json entry of the fixture camera (identity rotation, at the origin)."""
    return {
        "id": 0, "img_name": name, "width": CAMERA_W, "height": CAMERA_H,
        "position": [0.0, 0.0, 0.0], "rotation": np.eye(3).tolist(), "fx": CAMERA_F, "fy": CAMERA_F,
    }  # fmt: skip


def write_blob_model(root: Path, step: int = 500, with_images: bool = True) -> Path:
    """An INRIA model folder: two iterations (the highest must win), cameras.json, cfg_args
    pointing at a source folder with the training image."""
    model = root / "model"
    for iteration in (100, step):
        (model / "point_cloud" / f"iteration_{iteration}").mkdir(parents=True)
    write_ply(model / "point_cloud" / "iteration_100" / "point_cloud.ply", blob_params(per_blob=5, seed=1))
    write_ply(model / "point_cloud" / f"iteration_{step}" / "point_cloud.ply", blob_params())
    (model / "cameras.json").write_text(json.dumps([camera_entry()]))
    source = root / "source"
    (source / "images").mkdir(parents=True)
    if with_images:
        image = np.zeros((CAMERA_H, CAMERA_W, 3), np.uint8)
        image[:, : CAMERA_W // 2] = (0, 200, 0)  # BGR: green left half
        cv2.imwrite(str(source / "images" / "view_000.png"), image)
    (model / "cfg_args").write_text(f"Namespace(sh_degree=1, source_path={str(source)!r}, images='images')")
    return model


def scene_camera(name: str = "view_000") -> Camera:
    K = torch.tensor([[CAMERA_F, 0, CAMERA_W / 2], [0, CAMERA_F, CAMERA_H / 2], [0, 0, 1]], dtype=torch.float32)
    image = torch.zeros(CAMERA_H, CAMERA_W, 3)
    image[..., 1] = 0.5
    return Camera(name=name, width=CAMERA_W, height=CAMERA_H, K=K, world_to_cam=torch.eye(4), image=image)


def quiet(_msg: str) -> None:
    pass


# --- model loading --------------------------------------------------------------------


def test_load_model_folder_takes_highest_iteration_and_finds_thumbnails(tmp_path):
    model = write_blob_model(tmp_path, step=500)
    loaded = load_model(model)
    assert loaded.step == 500
    assert loaded.ply_path == model / "point_cloud" / "iteration_500" / "point_cloud.ply"
    assert loaded.num_gaussians == 600 and loaded.sh_degree == 1
    assert loaded.folder == model.resolve()
    np.testing.assert_allclose(loaded.params["means"], blob_params()["means"], atol=1e-6)

    (cam,) = loaded.cameras
    assert (cam.name, cam.width, cam.height, cam.fx, cam.fy) == ("view_000", CAMERA_W, CAMERA_H, CAMERA_F, CAMERA_F)
    np.testing.assert_allclose(cam.cam_to_world, np.eye(4))
    assert cam.fov_y == pytest.approx(2 * math.atan(CAMERA_H / 2 / CAMERA_F))
    assert cam.image_path == tmp_path / "source" / "images" / "view_000.png"
    assert max(cam.thumbnail.shape[:2]) <= 192
    h, w = cam.thumbnail.shape[:2]
    assert tuple(cam.thumbnail[h // 2, w // 4]) == (0, 200, 0)  # RGB order: the left half is green
    assert tuple(cam.thumbnail[h // 2, 3 * w // 4]) == (0, 0, 0)


def test_model_without_images_still_opens(tmp_path):
    model = write_blob_model(tmp_path, with_images=False)
    (cam,) = load_model(model).cameras
    assert cam.image_path is None and cam.thumbnail is None


def test_bare_ply_inside_a_model_folder_finds_its_cameras(tmp_path):
    model = write_blob_model(tmp_path)
    loaded = load_model(model / "point_cloud" / "iteration_100" / "point_cloud.ply")
    assert loaded.num_gaussians == 10 and loaded.step is None
    assert loaded.folder == model.resolve() and len(loaded.cameras) == 1


def test_bare_ply_alone(tmp_path):
    write_ply(tmp_path / "scene.ply", blob_params(per_blob=4))
    loaded = load_model(tmp_path / "scene.ply")
    assert loaded.num_gaussians == 8 and loaded.cameras == [] and loaded.folder == tmp_path.resolve()


@pytest.mark.parametrize(
    "content, problem",
    [
        ("{not json", "invalid JSON"),
        ('{"a": 1}', "expected a JSON list"),
        (json.dumps([{"id": 0, "width": 3}]), "has no field"),
        (json.dumps([dict(camera_entry(), rotation=[[1, 0], [0, 1]])]), "3x3"),
        (json.dumps([dict(camera_entry(), fx=0)]), "non-positive"),
    ],
)
def test_bad_cameras_json_is_a_one_line_input_error(tmp_path, content, problem):
    path = tmp_path / "cameras.json"
    path.write_text(content)
    with pytest.raises(InputError, match=re.escape(str(path)) + ".*" + problem):
        read_cameras_json(path)


def test_missing_model_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="nowhere"):
        load_model(tmp_path / "nowhere")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(InputError, match="notes.txt"):
        load_model(tmp_path / "notes.txt")


# --- splat conversion -----------------------------------------------------------------


def test_splat_covariance_is_R_S_S_Rt_against_a_per_gaussian_loop():
    params = blob_params(per_blob=20, seed=3)
    params["scales"] = np.random.default_rng(4).normal(-2.0, 0.5, (40, 3)).astype(np.float32)
    splats = splats_from_params(params)
    for i in range(40):
        w, x, y, z = params["quats"][i] / np.linalg.norm(params["quats"][i])
        # Rotation from the axis-angle form (independent of the matrix formula used).
        angle = 2 * math.atan2(math.sqrt(x * x + y * y + z * z), w)
        axis = np.array([x, y, z]) / max(math.sqrt(x * x + y * y + z * z), 1e-12)
        cross = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
        R = np.eye(3) + math.sin(angle) * cross + (1 - math.cos(angle)) * cross @ cross
        S = np.diag(np.exp(params["scales"][i].astype(np.float64)))
        np.testing.assert_allclose(splats.covariances[i], R @ S @ S @ R.T, rtol=1e-4, atol=1e-9)


def test_splat_known_values():
    params = {
        "means": np.array([[1.0, 2.0, 3.0]]),
        # 90 degrees about z: x -> y, so the x scale ends up on the y axis.
        "quats": np.array([[math.cos(math.pi / 4), 0.0, 0.0, math.sin(math.pi / 4)]]) * 7.0,  # any norm
        "scales": np.log(np.array([[0.1, 0.2, 0.3]])),
        "opacities": np.array([0.0]),
        "sh0": np.array([[[0.0, 10.0, -10.0]]]),
    }
    splats = splats_from_params(params)
    np.testing.assert_allclose(splats.covariances[0], np.diag([0.04, 0.01, 0.09]), atol=1e-7)
    np.testing.assert_allclose(splats.centers[0], [1, 2, 3])
    np.testing.assert_allclose(splats.rgbs[0], [0.5, 1.0, 0.0])  # 0.5 + 0.2821 * dc, clamped
    np.testing.assert_allclose(splats.opacities[0], [0.5])
    assert splats.covariances.dtype == np.float32 and splats.opacities.shape == (1, 1)


def test_splats_accept_torch_tensors_with_grad():
    params = {k: torch.from_numpy(v).requires_grad_(True) for k, v in blob_params(per_blob=3).items()}
    splats = splats_from_params(params)
    expected = 1 / (1 + np.exp(-3.0))
    np.testing.assert_allclose(splats.opacities[:, 0], expected, rtol=1e-6)
    rot = quat_to_rotmat(params["quats"].detach().numpy(), dtype=np.float32)
    np.testing.assert_allclose(rot @ rot.transpose(0, 2, 1), np.tile(np.eye(3), (6, 1, 1)), atol=1e-6)


# --- heatmap --------------------------------------------------------------------------


def test_heatmap_hot_tile_lands_where_it_covers_the_view():
    # A 40x24 view has a 3x2 grid of 16-pixel tiles (the last column and row overhang).
    error = np.zeros((2, 3), np.float32)
    error[1, 2] = 4.0  # bottom-right tile: view pixels x >= 32, y >= 16
    error[0, 0] = 1.0
    image = np.full((24, 40, 3), 100, np.uint8)
    out, peak = error_overlay(torch.from_numpy(error), image, view_size=(40, 24), blend=1.0)
    assert peak == 4.0 and out.shape == (24, 40, 3)
    turbo = cv2.cvtColor(cv2.applyColorMap(np.array([[0, 64, 255]], np.uint8), cv2.COLORMAP_TURBO), cv2.COLOR_BGR2RGB)[0]
    assert (out[16:, 32:] == turbo[2]).all()  # the peak colour, exactly on the overhanging tile
    assert (out[:16, :16] == turbo[1]).all()  # 1/4 of the peak
    assert (out[:16, 16:32] == turbo[0]).all() and (out[16:, :32] == turbo[0]).all()
    # Half-blended over a grey image: the average of the two.
    half, _ = error_overlay(error, image, view_size=(40, 24), blend=0.5)
    np.testing.assert_allclose(half[20, 35].astype(float), (turbo[2].astype(float) + 100) / 2, atol=1)


# --- binding --------------------------------------------------------------------------


def test_port_in_use_moves_to_the_next_free_port_and_says_so():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        messages = []
        server = ViewerServer("127.0.0.1", taken, log=messages.append)
        try:
            assert server.port != taken and taken < server.port <= taken + 20
            assert any(f"port {taken} is in use" in m and f"port {server.port}" in m for m in messages)
            assert server.url == f"http://localhost:{server.port}"
        finally:
            server.close()


def test_bad_port_and_host_are_one_line_errors():
    with pytest.raises(TurboGSError, match="outside 1..65535"):
        find_free_port("127.0.0.1", 70000)
    with pytest.raises(TurboGSError, match="cannot be resolved|cannot listen"):
        find_free_port("no-such-host.invalid", 8080)


def test_public_host_warns(monkeypatch):
    messages = []
    server = ViewerServer("0.0.0.0", 18500, log=messages.append)
    server.close()
    assert any("WARNING" in m and "0.0.0.0" in m for m in messages)
    quiet_messages = []
    ViewerServer("127.0.0.1", 18500, log=quiet_messages.append).close()
    assert not any("WARNING" in m for m in quiet_messages)


# --- serve_model ----------------------------------------------------------------------


def test_serve_model_shows_splats_cameras_and_starts_at_the_training_view(tmp_path):
    model = write_blob_model(tmp_path)
    server = serve_model(model, port=18520, block=False, log=quiet)
    try:
        assert server.splats_handle is not None and len(server.cameras) == 1
        initial = server.viser.initial_camera
        np.testing.assert_allclose(initial.position, [0, 0, 0])
        look = np.asarray(initial.look_at)
        assert look[2] > 0 and np.allclose(look[:2], 0)  # straight ahead, +z
        np.testing.assert_allclose(initial.up, [0, -1, 0])
        assert initial.fov == pytest.approx(2 * math.atan(CAMERA_H / 2 / CAMERA_F))
        assert server.renderer is None  # no CUDA on this machine: no server-render toggle
    finally:
        server.close()


def test_server_render_toggle_only_with_cuda(tmp_path, monkeypatch):
    server = ViewerServer("127.0.0.1", 18540, log=quiet)
    try:
        assert maybe_add_server_rendering(server, lambda: None) is None
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        renderer = maybe_add_server_rendering(server, lambda: None)
        assert renderer is not None and renderer.toggle.label == "Render on server (GPU)"
        renderer.close()
    finally:
        server.close()


def test_server_render_path_draws_the_blobs_where_the_camera_sees_them():
    """The GPU toggle's render path, run on the CPU twin: viewer camera -> turbogs render."""
    gaussians = gaussians_from_params(blob_params(per_blob=60), sh_degree=1, device="cpu")
    fov = 2 * math.atan(CAMERA_H / 2 / CAMERA_F)
    camera = camera_from_viewer((1.0, 0.0, 0.0, 0.0), (0.0, 0.0, 0.0), fov, CAMERA_W, CAMERA_H)
    assert (camera.width, camera.height) == (CAMERA_W, CAMERA_H)
    assert float(camera.K[0, 0]) == pytest.approx(CAMERA_F)
    image = render_rgb(gaussians, camera).astype(int)
    left = image[CAMERA_H // 2, round(CAMERA_W / 2 - CAMERA_F * 0.2)]  # x = -0.6 at depth 3
    right = image[CAMERA_H // 2, round(CAMERA_W / 2 + CAMERA_F * 0.2)]
    assert left[0] > 200 and left[2] < 80, left
    assert right[2] > 200 and right[0] < 80, right
    assert (image[5, 5] == 255).all()  # white background in the corner
    small = camera_from_viewer((1.0, 0.0, 0.0, 0.0), (0.0, 0.0, 0.0), fov, 3200, 2400)
    assert (small.width, small.height) == (1280, 960)


# --- LiveViewer -----------------------------------------------------------------------


@pytest.fixture
def live():
    viewer = LiveViewer([scene_camera()], port=18560, refresh_seconds=0.2, log=quiet)
    yield viewer
    viewer.close()


def test_update_costs_nothing_between_refreshes(live):
    calls = []

    def params():
        calls.append(1)
        return blob_params()

    live.update(0, 100, {"loss": 1.0}, params, None)  # the first call refreshes
    live.refresh_seconds = 3600.0
    live._next_refresh = time.monotonic() + 3600.0
    n = 20000
    start = time.perf_counter()
    for step in range(n):
        live.update(step, n, {"loss": 0.5, "psnr": 20.0}, params, None)
    per_call = (time.perf_counter() - start) / n
    assert per_call < 1e-3, f"{per_call * 1e6:.1f} us per update"
    assert per_call < 1e-4  # in fact it is a clock read: well under 0.1 ms
    assert len(calls) == 0  # no client connected: the Gaussians were never even asked for


def test_refresh_publishes_stats_and_curves(live):
    live.update(7, 100, {"loss": torch.tensor(0.25), "psnr": 21.5, "num_gaussians": 1234}, None, None)
    deadline = time.time() + 5
    while not live.steps and time.time() < deadline:
        time.sleep(0.01)
    assert live.steps == [7] and live.losses == [0.25] and live.psnrs == [21.5]
    text = live.status.content
    assert "**Step** 7 / 100 (7%)" in text and "0.2500" in text and "21.50 dB" in text and "1,234" in text
    assert live.progress.value == pytest.approx(7.0)
    assert np.array_equal(live.loss_plot.data[0], [7.0])


def test_pause_resume_stop(live):
    assert not live.paused and not live.stop_requested
    start = time.perf_counter()
    live.wait_if_paused()  # not paused: returns at once
    assert time.perf_counter() - start < 0.05

    live.pause()
    assert live.paused and live.resume_button.disabled is False and live.pause_button.disabled is True
    released = threading.Event()

    def training_loop():
        live.wait_if_paused()
        released.set()

    worker = threading.Thread(target=training_loop)
    worker.start()
    assert not released.wait(0.6)  # blocked while paused
    live.resume()
    assert released.wait(2.0)
    worker.join()

    live.pause()
    released.clear()
    worker = threading.Thread(target=training_loop)
    worker.start()
    assert not released.wait(0.3)
    live.request_stop()  # Stop also releases a paused loop, which then sees stop_requested
    assert released.wait(2.0) and live.stop_requested and not live.paused
    worker.join()


def test_a_signal_releases_a_paused_loop(live):
    """SIGTERM while paused: the trainer's `until` turns true, and the loop goes on to save."""
    live.pause()
    signalled = threading.Event()
    released = threading.Event()
    worker = threading.Thread(target=lambda: (live.wait_if_paused(until=signalled.is_set), released.set()))
    worker.start()
    assert not released.wait(0.3)
    signalled.set()
    assert released.wait(2.0) and live.paused  # the button stays as it was; the run stops
    worker.join()


def test_finish_pushes_the_final_model_without_any_browser(live):
    params = {k: torch.from_numpy(v) for k, v in blob_params(per_blob=10).items()}
    live.finish(params, block=False, step=100, total_steps=100)
    assert live.server.splats_handle is not None
    assert "**Step** 100 / 100" in live.status.content and "finished" in live.status.content


def _viser_client(port: int):
    """A raw websocket client that speaks enough of viser's protocol to count as a browser."""
    import msgspec
    import viser
    from viser import _messages
    from websockets.sync.client import connect

    ws = connect(f"ws://127.0.0.1:{port}", subprotocols=[f"viser-v{viser.__version__}"], max_size=None)
    hello = _messages.ViewerCameraMessage(
        wxyz=(1.0, 0.0, 0.0, 0.0), position=(0.0, 0.0, -1.0), fov=1.0, near=0.01, far=100.0,
        image_height=480, image_width=640, look_at=(0.0, 0.0, 0.0), up_direction=(0.0, -1.0, 0.0),
    )  # fmt: skip
    ws.send(msgspec.msgpack.encode(hello.as_serializable_dict()))
    return ws


def test_client_vanishing_mid_stream_never_reaches_training(live):
    logged = []
    live.log = logged.append
    live.server.log = logged.append
    ws = _viser_client(live.server.port)
    deadline = time.time() + 5
    while not live.server.clients() and time.time() < deadline:
        time.sleep(0.02)
    assert live.server.clients(), "the test client never registered"

    big = {k: torch.from_numpy(v) for k, v in blob_params(per_blob=20000).items()}
    heat = torch.rand(15, 20)
    step, received = 0, 0
    end = time.time() + 3.0
    while time.time() < end:  # a training loop: every step calls update()
        live.update(step, 10**6, {"loss": 0.1, "psnr": 20.0}, lambda: big, lambda view: heat)
        step += 1
        if received == 0:
            ws.recv(timeout=5)  # the stream has started ...
            received += 1
            ws.socket.close()  # ... and the browser disappears without a goodbye
        time.sleep(0.001)
    deadline = time.time() + 5
    while live.server.clients() and time.time() < deadline:
        time.sleep(0.02)
    assert not live.server.clients()
    # Training went on, refreshes kept being published, and nothing was reported as failing.
    assert step > 100 and len(live.steps) >= 5
    assert live._worker.is_alive()
    assert "view_000" in live.heatmap_caption.content  # the heatmap was published too
    assert not [m for m in logged if "failed" in m or "could not" in m], logged


def test_share_link_requests_are_refused():
    """viser can publish a page through a third-party tunnel; the viewer never does."""
    import msgspec
    from viser import _messages

    messages = []
    server = ViewerServer("127.0.0.1", 18580, log=messages.append)
    try:
        assert server.viser.request_share_url() is None
        ws = _viser_client(server.port)  # a browser's share button sends ShareUrlRequest
        ws.send(msgspec.msgpack.encode(_messages.ShareUrlRequest().as_serializable_dict()))
        deadline = time.time() + 5
        while sum("refused" in m for m in messages) < 2 and time.time() < deadline:
            time.sleep(0.02)
        assert sum("refused" in m for m in messages) == 2
        assert server.viser._share_tunnel is None
        ws.close()
    finally:
        server.close()


def _send_camera(ws, position):
    import msgspec
    from viser import _messages

    message = _messages.ViewerCameraMessage(
        wxyz=(1.0, 0.0, 0.0, 0.0), position=tuple(position), fov=1.0, near=0.01, far=100.0,
        image_height=480, image_width=640, look_at=(0.0, 0.0, 3.0), up_direction=(0.0, -1.0, 0.0),
    )  # fmt: skip
    ws.send(msgspec.msgpack.encode(message.as_serializable_dict()))


def test_the_frustum_a_browser_looks_through_is_hidden(tmp_path):
    """Its thumbnail would fill the whole view; it reappears once the browser moves away."""
    server = serve_model(write_blob_model(tmp_path), port=18600, block=False, log=quiet)
    try:
        (frustum,) = server._frustums
        assert frustum.visible is False  # new browsers start at this camera

        def wait_visible(expected):
            deadline = time.time() + 5
            while frustum.visible is not expected and time.time() < deadline:
                time.sleep(0.02)
            return frustum.visible is expected

        ws = _viser_client(server.port)  # reports a camera at (0, 0, -1): away from the camera
        assert wait_visible(True)
        _send_camera(ws, (0.0, 0.0, 0.0))  # back into the training camera
        assert wait_visible(False)
        _send_camera(ws, (0.5, 0.0, 0.0))
        assert wait_visible(True)

        # Clicking the frustum moves that browser onto the training camera.
        (client,) = server.clients()
        server.move_client_to(client, 0)
        np.testing.assert_allclose(client.camera.position, [0, 0, 0], atol=1e-9)
        np.testing.assert_allclose(client.camera.look_at[:2], [0, 0], atol=1e-9)
        assert client.camera.look_at[2] > 0
        assert client.camera.fov == pytest.approx(2 * math.atan(CAMERA_H / 2 / CAMERA_F))
        assert frustum.visible is False
        ws.close()
    finally:
        server.close()


def test_module_entry_point_serves_the_web_client_and_nothing_from_disk(tmp_path):
    """`python -m turbogs.viewer MODEL`: the page loads, the model's files are not served."""
    import os
    import subprocess
    import sys
    import urllib.error
    import urllib.request

    model = write_blob_model(tmp_path)
    process = subprocess.Popen(
        [sys.executable, "-m", "turbogs.viewer", str(model), "--port", "18620"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ, NO_COLOR="1"),
    )  # fmt: skip
    try:
        url = None
        deadline = time.time() + 60
        while url is None and time.time() < deadline:
            line = process.stdout.readline()
            assert line, "the viewer exited early"
            match = re.search(r"open (http://\S+) in a browser", line)
            url = match.group(1) if match else None
        assert url is not None
        base = url.replace("localhost", "127.0.0.1")
        with urllib.request.urlopen(base + "/", timeout=10) as page:
            assert b"<html" in page.read().lower()
        relative = os.path.relpath(model / "cameras.json", "/")
        for path in ["/cameras.json", "/cfg_args", "/../../../../" + relative, "/%2e%2e/%2e%2e/" + relative]:
            try:
                with urllib.request.urlopen(base + path, timeout=10) as response:
                    body = response.read()
                assert b"img_name" not in body and b"Namespace" not in body, path
            except urllib.error.HTTPError as exc:
                assert exc.code in (400, 403, 404), (path, exc.code)
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_module_entry_point_reports_a_bad_model_in_one_line(tmp_path):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "turbogs.viewer", str(tmp_path / "missing"), "--port", "18640"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "missing" in result.stderr and "Traceback" not in result.stderr


def test_heatmap_without_a_photo_keeps_the_view_shape():
    error = np.zeros((2, 3), np.float32)
    error[0, 2] = 1.0
    out, peak = error_overlay(error, None, view_size=(40, 24), blend=1.0)
    assert out.shape == (24, 40, 3) and peak == 1.0
    red = cv2.cvtColor(cv2.applyColorMap(np.array([[255]], np.uint8), cv2.COLORMAP_TURBO), cv2.COLOR_BGR2RGB)[0, 0]
    assert (out[:16, 32:] == red).all() and not (out[16:, 32:] == red).all(axis=-1).any()


@pytest.mark.parametrize("block", [False, True])
def test_train_with_viewer_closes_the_viewer_when_training_ends(tmp_path, monkeypatch, block):
    """`turbogs train --viewer --no-block` must end when training does: the viewer is closed,
    its port freed, so the process exits. Without --no-block it first serves the final
    model until Ctrl-C (here a serve_forever that returns at once)."""
    import turbogs.viewer
    from turbogs.viewer.server import _can_bind

    from turbogs.cli import main

    made, served = [], []

    class Recorded(LiveViewer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(turbogs.viewer, "LiveViewer", Recorded)
    monkeypatch.setattr(ViewerServer, "serve_forever", lambda server: served.append(not server._closed))
    demo = Path(__file__).resolve().parents[1] / "scenes" / "demo"
    args = ["train", str(demo), "--steps", "3", "--device", "cpu", "--viewer", "--port", "18660",
            "--out", str(tmp_path / "model"), "--quiet"] + ([] if block else ["--no-block"])  # fmt: skip
    assert main(args) == 0
    (viewer,) = made
    assert served == ([True] if block else [])  # blocking: served while still open
    assert viewer._closed and viewer.server._closed and not viewer._worker.is_alive()
    assert viewer.server.splats_handle is not None  # the final model was shown before closing
    assert _can_bind("127.0.0.1", viewer.server.port)


def test_camera_spacing_is_the_median_nearest_neighbour_distance():
    """Frustums are sized by camera spacing, so they neither swamp a tight orbit nor vanish
    in a city-scale capture. Checked against a brute-force loop, at two scales and over the
    512-camera block boundary, and for the degenerate cases."""
    from turbogs.viewer.server import camera_spacing

    rng = np.random.default_rng(0)
    centers = rng.normal(size=(700, 3))
    centers[5] = centers[4]  # two cameras at one spot: not each other's neighbour
    brute = []
    for i, c in enumerate(centers):
        others = [np.linalg.norm(c - o) for j, o in enumerate(centers) if j != i and np.linalg.norm(c - o) > 0]
        brute.append(min(others))
    assert camera_spacing(centers) == pytest.approx(np.median(brute), rel=1e-12)
    assert camera_spacing(centers * 1000.0) == pytest.approx(1000.0 * np.median(brute), rel=1e-12)
    grid = np.stack(np.meshgrid(np.arange(4), np.arange(4), [0.0]), -1).reshape(-1, 3) * 0.5
    assert camera_spacing(grid) == pytest.approx(0.5)
    assert camera_spacing(np.zeros((1, 3)), fallback=7.0) == 7.0
    assert camera_spacing(np.zeros((3, 3)), fallback=7.0) == 7.0  # all at one spot
