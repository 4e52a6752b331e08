"""The live viewer on --host 0.0.0.0 in a real (headless) Chromium: without --viewer-control,
clicking Stop does not stop training; with it, it does. The page is opened through
127.0.0.1, but the server is bound to every interface, so it is the network viewer.

Without the flag the Stop button is shown disabled. That alone would prove nothing: viser
does not check `disabled` on the server, and a browser is the stranger's to control. So
the page also runs the button's own click handler as a devtools user would, the browser
sends the click over its websocket, and the server refuses it.

Skipped only on a developer machine without Chromium; on CI (env CI set) they must run.
"""

from __future__ import annotations

import time

import pytest
from browser import chromium_page, require_browser, save_artifact, screenshot_rgb
from test_trust import wait_until
from test_viewer import scene_camera
from test_viewer_browser import VIEW_H, VIEW_W, dom_step, start_fake_training, wait_for_step_change
from turbogs.viewer import LiveViewer


@pytest.fixture(autouse=True)
def _browser_available():
    require_browser()


# What a user with the browser's devtools can do: call the Stop button's React click
# handler (viser's client sends GuiUpdateMessage {value: true} for it), disabled or not.
FORCE_CLICK = """uuid => {
    const button = document.getElementById(uuid);
    const props = Object.keys(button).find(key => key.startsWith("__reactProps"));
    button[props].onClick();
}"""


@pytest.mark.parametrize("control", [False, True], ids=["read-only", "viewer-control"])
def test_stop_from_a_browser_on_a_public_host_needs_viewer_control(control):
    logged = []
    viewer = LiveViewer([scene_camera()], host="0.0.0.0", port=18740 + 20 * control, refresh_seconds=0.3,
                        log=logged.append, control=control)
    trainer, progress = start_fake_training(viewer)
    try:
        startup = [m for m in logged if "0.0.0.0" in m]
        assert len(startup) == 1 and ("read-only" in startup[0]) != control, startup
        with chromium_page(VIEW_W, VIEW_H) as page:
            page.goto(f"http://127.0.0.1:{viewer.server.port}")
            page.wait_for_selector("canvas", timeout=30_000)
            page.get_by_text("Step", exact=False).first.wait_for(timeout=30_000)
            first = dom_step(page)
            assert wait_for_step_change(page, first) > first, "the step counter in the page did not advance"
            stop = page.get_by_role("button", name="Stop")

            if control:
                stop.click()
                trainer.join(timeout=10)
                assert progress["done"] and viewer.stop_requested
                return

            assert stop.is_disabled() and "Read-only" in page.inner_text("body")
            stop.click(force=True)  # a click on the greyed-out button: the browser sends nothing
            time.sleep(0.5)
            assert not any("refused" in m for m in logged) and not viewer.stop_requested
            (browser_id,) = viewer.server.viser.get_clients()
            page.evaluate(FORCE_CLICK, viewer.stop_button._impl.uuid)  # the browser sends the click anyway
            refused = f"refused a request to stop training from browser {browser_id}"
            assert wait_until(lambda: any(refused in m for m in logged)), logged

            before = progress["step"]
            assert wait_until(lambda: progress["step"] > before + 50), "training stalled"
            assert not viewer.stop_requested and not progress["done"]
            shown = dom_step(page)
            assert wait_for_step_change(page, shown) > shown, "the page stopped following training"
            png, _ = screenshot_rgb(page)
            print("read-only viewer screenshot:", *save_artifact(png, "viewer_read_only.png"))
    finally:
        viewer.close()
        trainer.join(timeout=5)
