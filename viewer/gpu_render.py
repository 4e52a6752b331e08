"""Optional server-side rendering: each browser's view rendered by `turbogs.render` on this
machine's GPU and shown as that browser's background image.

The browser's own WebGL splatting only evaluates the DC color and sorts approximately;
the server render is what training sees (all SH bands, exact per-tile sorting). It costs
a GPU render per camera move, so it is offered only when CUDA is available, as a toggle.
"""

from __future__ import annotations

import math
import threading
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import torch
import viser

from turbogs.data.scene import Camera
from turbogs.gaussians import Gaussians

from .server import ViewerServer

MAX_RENDER_SIDE = 1280  # pixels; larger browser windows are rendered at this size and upscaled
# Returns (raw pre-activation params, SH degree) of the Gaussians to show, or None.
# (params, sh_degree, antialiased): the model's render mode travels with its parameters
GaussianSource = Callable[[], Optional[Tuple[Dict[str, object], int, bool]]]


def camera_from_viewer(wxyz, position, fov_y: float, width: int, height: int, max_side: int = MAX_RENDER_SIDE) -> Camera:
    """A browser camera (cam-to-world rotation as wxyz, OpenCV axes, vertical fov) ->
    a turbogs Camera, shrunk so that its longer side is at most `max_side`."""
    factor = min(1.0, max_side / max(width, height, 1))
    width, height = max(1, round(width * factor)), max(1, round(height * factor))
    focal = 0.5 * height / math.tan(0.5 * fov_y)
    K = torch.tensor([[focal, 0.0, width / 2.0], [0.0, focal, height / 2.0], [0.0, 0.0, 1.0]], dtype=torch.float32)
    c2w = np.eye(4)
    c2w[:3, :3] = viser.transforms.SO3(np.asarray(wxyz, dtype=np.float64)).as_matrix()
    c2w[:3, 3] = np.asarray(position, dtype=np.float64)
    w2c = torch.from_numpy(np.linalg.inv(c2w)).float()
    return Camera(name="viewer", width=width, height=height, K=K, world_to_cam=w2c)


def render_rgb(gaussians: Gaussians, camera: Camera, background=(1.0, 1.0, 1.0)) -> np.ndarray:
    """uint8 [H, W, 3] render of `gaussians` from `camera` over `background`."""
    from turbogs.render import render  # imported here: only a GPU machine needs it

    with torch.no_grad():
        out = render(gaussians, camera, sh_degree=gaussians.sh_degree, background=torch.tensor(background))
    return (out.image.clamp(0, 1) * 255 + 0.5).to(torch.uint8).cpu().numpy()


def gaussians_from_params(params: Dict[str, object], sh_degree: int, device: str, antialiased: bool = False) -> Gaussians:
    tensors = {k: torch.as_tensor(v).to(device=device, dtype=torch.float32) for k, v in params.items()}
    return Gaussians(tensors, sh_degree=sh_degree, active_sh_degree=sh_degree, antialiased=antialiased)


class ServerRenderer:
    """Renders every connected browser's view when enabled, newest camera pose only."""

    def __init__(self, server: ViewerServer, source: GaussianSource, device: str = "cuda"):
        self.server = server
        self.source = source
        self.device = device
        self.enabled = False
        self._cache: Tuple[int, Optional[Gaussians]] = (0, None)
        self._dirty: Dict[int, viser.ClientHandle] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self.toggle = server.viser.gui.add_checkbox(
            "Render on server (GPU)", False, hint="Render with turbogs on this machine's GPU (all SH bands)"
        )
        self.toggle.on_update(lambda _: self.set_enabled(self.toggle.value))
        server.viser.on_client_connect(self._watch_client)
        self._thread = threading.Thread(target=self._loop, name="turbogs-server-render", daemon=True)
        self._thread.start()

    def _watch_client(self, client: viser.ClientHandle) -> None:
        client.camera.on_update(lambda _: self.request(client))

    def request(self, client: viser.ClientHandle) -> None:
        if self.enabled:
            with self._lock:
                self._dirty[client.client_id] = client
            self._wake.set()

    def set_enabled(self, enabled: bool) -> None:
        self.enabled = enabled
        if self.server.splats_handle is not None:
            self.server.splats_handle.visible = not enabled
        for client in self.server.clients():
            if enabled:
                self.request(client)
            else:
                try:
                    client.scene.set_background_image(None)
                except Exception:  # the browser may be gone; nothing to clear then
                    pass

    def _gaussians(self) -> Optional[Gaussians]:
        found = self.source()
        if found is None:
            return None
        params, sh_degree, antialiased = found
        if self._cache[0] != id(params):
            self._cache = (id(params), gaussians_from_params(params, sh_degree, self.device, antialiased))
        return self._cache[1]

    def render_for(self, client: viser.ClientHandle) -> None:
        gaussians = self._gaussians()
        cam = client.camera
        if gaussians is None or cam.image_width <= 0:
            return
        camera = camera_from_viewer(cam.wxyz, cam.position, cam.fov, cam.image_width, cam.image_height)
        client.scene.set_background_image(render_rgb(gaussians, camera), format="jpeg", jpeg_quality=90)

    def _loop(self) -> None:
        while not self._stop:
            self._wake.wait(timeout=0.5)
            self._wake.clear()
            with self._lock:
                pending, self._dirty = list(self._dirty.values()), {}
            for client in pending:
                if not self.enabled:
                    break
                try:
                    self.render_for(client)
                except Exception as exc:  # a closed tab or a failed render must not kill the viewer
                    self.server.log(f"viewer: server-side render failed: {exc}")

    def close(self) -> None:
        self._stop = True
        self._wake.set()


def maybe_add_server_rendering(server: ViewerServer, source: GaussianSource) -> Optional[ServerRenderer]:
    """The toggle exists only where CUDA does: on a CPU the render would take seconds per frame."""
    if not torch.cuda.is_available():
        return None
    return ServerRenderer(server, source)
