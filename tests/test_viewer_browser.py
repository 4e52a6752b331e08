"""The viewer in a real (headless) Chromium: the splats are drawn where they should be,
the screenshot button writes a PNG, and the live view follows and controls a training loop.

Skipped only on a developer machine without Chromium; on CI (env CI set) they must run.
"""

from __future__ import annotations

import math
import re
import threading
import time

import cv2
import numpy as np
import pytest
import torch
from browser import chromium_page, require_browser, save_artifact, screenshot_rgb
from test_viewer import BLOBS, CAMERA_F, CAMERA_H, blob_params, scene_camera, write_blob_model
from turbogs.viewer import LiveViewer, serve_model

VIEW_W, VIEW_H = 1280, 720  # the control panel sits at the right edge, x > ~940
STEP_TEXT = re.compile(r"Step\s+([\d,]+)\s*/")


@pytest.fixture(autouse=True)
def _browser_available():
    require_browser()


def expected_pixel(center, width: int, height: int) -> tuple:
    """Where a world point lands in a browser of this size looking through the fixture
    camera: viser keeps the camera's vertical field of view and centres the image."""
    focal = (height / 2) * (2 * CAMERA_F / CAMERA_H)  # (H/2) / tan(fov_y / 2)
    x, y, z = center
    return round(width / 2 + focal * x / z), round(height / 2 + focal * y / z)


def patch_mean(image: np.ndarray, xy, radius: int = 4) -> np.ndarray:
    x, y = xy
    return image[y - radius : y + radius + 1, x - radius : x + radius + 1, :3].reshape(-1, 3).mean(axis=0)


def looks_like(rgb, color) -> bool:
    """Dominated by the blob's color: its strong channel high, the others clearly lower."""
    rgb = np.asarray(rgb, dtype=float)
    strong = int(np.argmax(color))
    others = [c for c in range(3) if c != strong]
    return rgb[strong] > 150 and all(rgb[strong] - rgb[c] > 80 for c in others)


def blobs_visible(image: np.ndarray) -> bool:
    h, w = image.shape[:2]
    return all(looks_like(patch_mean(image, expected_pixel(c, w, h)), color) for c, color in BLOBS.values())


def test_model_viewer_draws_the_splats_and_saves_a_screenshot(tmp_path):
    model = write_blob_model(tmp_path)
    server = serve_model(model, port=18700, block=False, log=lambda m: None)
    try:
        with chromium_page(VIEW_W, VIEW_H) as page:
            page.goto(server.url.replace("localhost", "127.0.0.1"))
            page.wait_for_selector("canvas", timeout=30_000)
            page.get_by_text("Save screenshot").wait_for(timeout=30_000)

            # WebGL on SwiftShader needs a few frames: poll until the splats appear.
            deadline = time.time() + 30
            png, image = screenshot_rgb(page)
            while not blobs_visible(image) and time.time() < deadline:
                time.sleep(0.5)
                png, image = screenshot_rgb(page)
            paths = save_artifact(png, "viewer_model.png")
            print("viewer screenshot:", *paths)

            h, w = image.shape[:2]
            for center, color in BLOBS.values():
                xy = expected_pixel(center, w, h)
                assert looks_like(patch_mean(image, xy), color), (xy, patch_mean(image, xy), paths)
            # Between the blobs, and above them, only background: the splats did not smear.
            background = patch_mean(image, (w // 2, h // 2))
            assert background.min() > 200, background
            assert patch_mean(image, (w // 2, h // 2 - 200)).min() > 200
            # The splats really differ from the background where the object is.
            red = patch_mean(image, expected_pixel(BLOBS["red"][0], w, h))
            assert np.abs(red - background).max() > 100

            # The "Save screenshot" button: the browser renders a frame, the server saves it.
            page.get_by_text("Save screenshot").click()
            deadline = time.time() + 30
            while not list(model.glob("screenshot_*.png")) and time.time() < deadline:
                time.sleep(0.25)
            (saved,) = list(model.glob("screenshot_*.png"))
            assert not list(model.glob(".screenshot_*"))  # the atomic write left no temporary
            shot = cv2.cvtColor(cv2.imread(str(saved)), cv2.COLOR_BGR2RGB)
            save_artifact(saved.read_bytes(), "viewer_saved_screenshot.png")
            assert blobs_visible(shot), [patch_mean(shot, expected_pixel(c, shot.shape[1], shot.shape[0])) for c, _ in BLOBS.values()]
    finally:
        server.close()


def dom_step(page) -> int:
    match = STEP_TEXT.search(page.inner_text("body"))
    assert match, page.inner_text("body")[:500]
    return int(match.group(1).replace(",", ""))


def wait_for_step_change(page, old: int, timeout: float = 15.0) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline:
        new = dom_step(page)
        if new != old:
            return new
        time.sleep(0.2)
    return old


def start_fake_training(viewer: LiveViewer):
    """A training loop in a thread that feeds `viewer` and honours its Pause and Stop:
    returns (thread, progress), progress = {"step": last step, "done": loop ended}."""
    params = {k: torch.from_numpy(v) for k, v in blob_params(per_blob=100).items()}
    heat = torch.rand(15, 20, generator=torch.Generator().manual_seed(0))
    progress = {"step": 0, "done": False}

    def fake_training():
        step = 0
        while not viewer.stop_requested and step < 10**6:
            viewer.wait_if_paused()
            step += 1
            progress["step"] = step
            viewer.update(step, 10**6, {"loss": 1.0 / step, "psnr": 10 + math.log(step)}, lambda: params, lambda v: heat)
            time.sleep(0.005)
        progress["done"] = True

    trainer = threading.Thread(target=fake_training, daemon=True)
    trainer.start()
    return trainer, progress


def test_live_viewer_follows_and_controls_a_training_loop():
    viewer = LiveViewer([scene_camera()], port=18720, refresh_seconds=0.3, log=lambda m: None)
    trainer, progress = start_fake_training(viewer)
    try:
        with chromium_page(VIEW_W, VIEW_H) as page:
            page.goto(viewer.server.url.replace("localhost", "127.0.0.1"))
            page.wait_for_selector("canvas", timeout=30_000)
            page.get_by_text("Step", exact=False).first.wait_for(timeout=30_000)

            first = dom_step(page)
            second = wait_for_step_change(page, first)
            assert second > first, "the step counter in the page did not advance"
            third = wait_for_step_change(page, second)
            assert third > second

            # Pause in the browser: the loop blocks, and the page stops advancing.
            page.get_by_role("button", name="Pause").click()
            deadline = time.time() + 10
            while not viewer.paused and time.time() < deadline:
                time.sleep(0.05)
            assert viewer.paused
            time.sleep(0.3)
            frozen = progress["step"]
            time.sleep(1.0)
            assert progress["step"] == frozen
            page.get_by_text("paused").first.wait_for(timeout=10_000)

            page.get_by_role("button", name="Resume").click()
            deadline = time.time() + 10
            while progress["step"] == frozen and time.time() < deadline:
                time.sleep(0.05)
            assert progress["step"] > frozen
            resumed = wait_for_step_change(page, dom_step(page))
            assert resumed > frozen

            # The error heatmap of the selected view is published too.
            assert "Error memory of view_000 at step" in page.inner_text("body")
            png, _ = screenshot_rgb(page)
            paths = save_artifact(png, "viewer_live.png")
            page.get_by_text("Error memory of").first.scroll_into_view_if_needed()
            png, _ = screenshot_rgb(page)
            paths += save_artifact(png, "viewer_live_heatmap.png")
            print("live viewer screenshots:", *paths)

            page.get_by_role("button", name="Stop").click()
            trainer.join(timeout=10)
            assert progress["done"] and viewer.stop_requested
    finally:
        viewer.close()
        trainer.join(timeout=5)


def stroke_pixels(image: np.ndarray, rgb, tolerance: int = 40) -> int:
    return int((np.abs(image[..., :3].astype(int) - np.asarray(rgb)).max(axis=-1) <= tolerance).sum())


def test_curves_draw_in_a_browser_that_connected_before_the_first_point():
    """uPlot charts created empty never drew, even after points arrived: the page opened at
    the start of training showed blank Loss/PSNR charts until reloaded."""
    from turbogs.viewer.live import Snapshot

    viewer = LiveViewer([scene_camera()], port=18740, log=lambda m: None)
    try:
        with chromium_page(VIEW_W, VIEW_H) as page:
            page.goto(viewer.server.url.replace("localhost", "127.0.0.1"))
            charts = page.locator(".uplot canvas")  # the plot itself; the legend's swatches are HTML
            charts.nth(1).wait_for(timeout=30_000)  # both charts exist before any point
            for step in range(1, 21):
                viewer.publish(Snapshot(step * 10, 200, float(step), {"loss": 1.0 / step, "psnr": 10.0 + step}))
            deadline = time.time() + 30
            while True:
                shots = [screenshot_rgb(chart) for chart in charts.all()]
                counts = [stroke_pixels(shots[0][1], (0xD9, 0x48, 0x0F)), stroke_pixels(shots[1][1], (0x19, 0x71, 0xC2))]
                if min(counts) >= 100 or time.time() > deadline:
                    break
                time.sleep(0.5)
            paths = save_artifact(shots[0][0], "viewer_live_loss_chart.png")
            assert min(counts) >= 100, (counts, paths)
    finally:
        viewer.close()
