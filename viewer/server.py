"""The viser server both viewers share: safe binding, the splats, the training cameras.

Security: by default the server listens on 127.0.0.1 only. Listening on every interface
(0.0.0.0) exposes the model to the network, so it is allowed but announced. viser's HTTP
side serves only its own bundled web client; the model reaches the browser through the
websocket and nothing on disk is served.

Off loopback the viewer is read-only unless started with `control=True` (--viewer-control):
the controls that act on this machine (pause/resume/stop training, saving screenshots)
are shown disabled and, since any client can send viser a click for any button (viser
does not enforce `disabled`), their handlers refuse on the server side too (`guarded`).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import cv2
import numpy as np
import viser

from turbogs.errors import TurboGSError
from turbogs.fileio import atomic_path

from .cameras import ViewCamera
from .splats import Splats, robust_bounds

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
PORT_ATTEMPTS = 20  # ports tried after the requested one before giving up
SPLATS_NODE = "/gaussians"
FRUSTUM_COLOR = (40, 90, 200)
FRUSTUM_MIN_SCALE = 1e-3  # of the scene radius: frustums of cameras bunched together stay visible
FRUSTUM_LINE_PX = 2.0  # screen pixels: world-unit lines vanish in large scenes and swamp small ones
Log = Callable[[str], None]


def _can_bind(host: str, port: int) -> bool:
    """Whether a listening socket could be bound to (host, port) right now. Uses the same
    SO_REUSEADDR setting as the asyncio server, so a port in TIME_WAIT counts as free."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise TurboGSError(f"viewer host '{host}' cannot be resolved ({exc.strerror})") from None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    return False
                raise TurboGSError(f"viewer cannot listen on {host}:{port} ({exc.strerror})") from None
    return True


def is_loopback(host: str) -> bool:
    """Whether `host` reaches this machine only: every address it resolves to is loopback
    (127.0.0.0/8, ::1). 0.0.0.0 and :: (every interface) are not."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError):
        return False
    addresses = {info[4][0].split("%", 1)[0] for info in infos}
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def exposure_warning(host: str, control: bool, controls: str) -> str:
    """The startup line of a viewer that listens beyond this machine: who can see, who can act."""
    seen = f"viewer: WARNING: listening on {host} makes the model visible to every machine that can reach this one"
    if control:
        return f"{seen}, and --viewer-control lets any of them {controls}; use --host 127.0.0.1 to keep it local"
    return (f"{seen}; it is read-only there: no browser can {controls} (--viewer-control allows that); "
            "use --host 127.0.0.1 to keep it local")


def find_free_port(host: str, port: int, attempts: int = PORT_ATTEMPTS) -> int:
    """The first port from `port` on that can be bound, or a one-line error."""
    if not 0 < port < 65536:
        raise TurboGSError(f"viewer port {port} is outside 1..65535")
    last = min(port + attempts, 65535)
    for candidate in range(port, last + 1):
        if _can_bind(host, candidate):
            return candidate
    raise TurboGSError(f"viewer ports {port}..{last} on {host} are all in use; pass another --port")


def composite_over(rgba: np.ndarray, background=(255, 255, 255)) -> np.ndarray:
    """Flatten an RGBA render onto the viewer's background color -> uint8 RGB."""
    if rgba.shape[-1] == 3:
        return rgba.astype(np.uint8)
    alpha = rgba[..., 3:4].astype(np.float32) / 255.0
    rgb = rgba[..., :3].astype(np.float32) * alpha + np.asarray(background, np.float32) * (1.0 - alpha)
    return np.clip(rgb + 0.5, 0, 255).astype(np.uint8)


def camera_spacing(centers: np.ndarray, fallback: float = 1.0) -> float:
    """The typical distance between neighbouring cameras: the median distance from each
    camera to its nearest other one. Frustums sized by it neither overlap nor vanish,
    whatever the scene's units and extent. `fallback` when fewer than two cameras differ."""
    centers = np.asarray(centers, dtype=np.float64).reshape(-1, 3)
    nearest = [np.full(0, np.inf)]
    for start in range(0, len(centers), 512):  # in blocks: thousands of cameras, little memory
        distances = np.linalg.norm(centers[start : start + 512, None] - centers[None], axis=-1)
        distances[distances <= 0.0] = np.inf  # the camera itself, and others at the same spot
        nearest.append(distances.min(axis=1))
    nearest = np.concatenate(nearest)
    nearest = nearest[np.isfinite(nearest)]
    return float(np.median(nearest)) if nearest.size else float(fallback)


class ViewerServer:
    """A viser server that shows one set of Gaussians and its training cameras."""

    def __init__(self, host: str = "127.0.0.1", port: int = 8080, *, title: str = "TurboGS", log: Log = print,
                 control: bool = False, controls: str = "use its controls"):
        """control: let browsers off loopback use the controls (--viewer-control); on loopback
        they always can. controls: what those controls do, for the startup line."""
        self.log = log
        self.host = host
        local = is_loopback(host)
        self.control_allowed = local or control
        self._refusals_logged: set = set()
        if not local:
            log(exposure_warning(host, control, controls))
        free = find_free_port(host, port)
        self.viser = viser.ViserServer(host=host, port=free, label=title, verbose=False)
        self.port = self.viser.get_port()  # viser itself moves on if it lost a race for `free`
        # viser can publish the page through a third-party tunnel ("share" button): never.
        self.viser.gui.configure_theme(show_share_button=False)
        self.viser.request_share_url = self._refuse_share_url
        if self.port != port:
            log(f"viewer: port {port} is in use; using port {self.port} instead")
        shown_host = "localhost" if host in LOOPBACK_HOSTS or host in ("0.0.0.0", "::") else host
        self.url = f"http://{shown_host}:{self.port}"
        log(f"viewer: open {self.url} in a browser")

        self.cameras: List[ViewCamera] = []
        self.model = None  # the LoadedModel when serving a model folder (turbogs.viewer.saved_model)
        self.renderer = None  # the ServerRenderer when CUDA offers server-side rendering
        self.splats_handle = None
        self.scene_center = np.zeros(3)
        self.scene_radius = 1.0
        self._frustums: list = []
        self._initial_index: Optional[int] = None  # the training camera new browsers start at
        self._client_at: Dict[int, Optional[int]] = {}  # browser -> training camera it looks through
        self._client_at_lock = threading.Lock()  # viser calls back from several threads
        self.viser.on_client_connect(self._on_connect)
        self.viser.on_client_disconnect(self._on_disconnect)
        self._closed = False

    def guarded(self, action: str, handler: Callable[[viser.GuiEvent], None]) -> Callable[[viser.GuiEvent], None]:
        """A click handler that runs `handler` only when this viewer allows control. Disabling
        a button is not enough: a client can send the click for any button's id."""

        def handle(event: viser.GuiEvent) -> None:
            if self.control_allowed:
                handler(event)
                return
            client_id = getattr(event, "client_id", None)
            if client_id not in self._refusals_logged:  # once per browser: a flood stays one line
                self._refusals_logged.add(client_id)
                self.log(f"viewer: refused a request to {action} from browser {client_id}: this viewer is "
                         f"read-only on {self.host} (start it with --viewer-control to allow that)")
            if event.client is not None:
                event.client.add_notification("Read-only viewer", f"This viewer cannot {action}: it was started "
                                              "without --viewer-control.", auto_close_seconds=6.0, color="red")

        return handle

    def control_note(self) -> Optional[str]:
        """The line a read-only viewer shows above its disabled controls; None when they work."""
        if self.control_allowed:
            return None
        return (f"*Read-only:* this viewer listens on {self.host}, so its controls are off "
                "(start with `--viewer-control` to allow them).")

    def _refuse_share_url(self, *args, **kwargs) -> None:
        self.log("viewer: refused a request to publish the viewer through a public share link")
        return None

    # --- content --------------------------------------------------------------------
    def set_splats(self, splats: Splats, visible: bool = True) -> None:
        """Show (or replace) the Gaussians; every connected and future client receives them."""
        if len(splats) == 0:
            if self.splats_handle is not None:
                self.splats_handle.remove()
                self.splats_handle = None
            return
        self.splats_handle = self.viser.scene.add_gaussian_splats(
            SPLATS_NODE, splats.centers, splats.covariances, splats.rgbs, splats.opacities, visible=visible
        )

    def set_scene_bounds(self, centers: np.ndarray) -> np.ndarray:
        """Remember where the bulk of the scene is (for camera placement); returns [2, 3] bounds."""
        bounds = robust_bounds(centers)
        self.scene_center = bounds.mean(axis=0)
        self.scene_radius = max(float(np.linalg.norm(bounds[1] - bounds[0])) / 2.0, 1e-3)
        return bounds

    def set_cameras(self, cameras: Sequence[ViewCamera]) -> None:
        """Draw the training cameras as frustums (with thumbnails when available).
        Clicking one moves that browser's camera onto it."""
        self.cameras = list(cameras)
        for handle in self._frustums:
            handle.remove()
        self._frustums = []
        if not self.cameras:
            return
        spacing = camera_spacing(np.stack([c.position for c in self.cameras]), fallback=self.scene_radius)
        scale = max(0.25 * spacing, FRUSTUM_MIN_SCALE * self.scene_radius)
        for index, cam in enumerate(self.cameras):
            handle = self.viser.scene.add_camera_frustum(
                f"/training_cameras/{index}", fov=cam.fov_y, aspect=cam.aspect, scale=scale,
                thickness=FRUSTUM_LINE_PX, thickness_units="screen",
                color=FRUSTUM_COLOR, image=cam.thumbnail, wxyz=cam.wxyz, position=cam.position,
            )  # fmt: skip
            handle.on_click(lambda event, index=index: self.move_client_to(event.client, index))
            self._frustums.append(handle)
        self._update_frustum_visibility()

    def look_distance(self, cam: ViewCamera) -> float:
        """How far ahead of `cam` to put the orbit center: the scene center's depth."""
        depth = float(np.dot(self.scene_center - cam.position, cam.forward))
        return max(depth, 0.1 * self.scene_radius, 1e-3)

    def set_initial_view(self, cam_index: Optional[int]) -> None:
        """New browsers start at training camera `cam_index`, or, without one, looking at
        the scene center along +z from 2.5 radii away, image-up = -y as in COLMAP scenes."""
        self._initial_index = cam_index
        initial = self.viser.initial_camera
        if cam_index is not None:
            cam = self.cameras[cam_index]
            initial.fov = cam.fov_y
            initial.position = tuple(cam.position)
            initial.look_at = tuple(cam.position + cam.forward * self.look_distance(cam))
            initial.up = tuple(cam.up)
        else:
            initial.fov = np.deg2rad(60.0)
            initial.position = tuple(self.scene_center - np.array([0.0, 0.0, 2.5 * self.scene_radius]))
            initial.look_at = tuple(self.scene_center)
            initial.up = (0.0, -1.0, 0.0)
        self._update_frustum_visibility()

    def move_client_to(self, client: viser.ClientHandle, cam_index: int) -> None:
        cam = self.cameras[cam_index]
        with self._client_at_lock:
            self._client_at[client.client_id] = cam_index
        self._update_frustum_visibility()
        with client.atomic():
            client.camera.fov = cam.fov_y
            client.camera.position = cam.position
            client.camera.look_at = cam.position + cam.forward * self.look_distance(cam)
            client.camera.up_direction = cam.up

    # A frustum's thumbnail sits right in front of its camera, so a browser looking through
    # a training camera would see only the thumbnail. The frustum a browser stands in is
    # therefore hidden until the browser moves away. A new browser starts at the initial
    # camera; with no browser connected, that is the one hidden.
    def _on_connect(self, client: viser.ClientHandle) -> None:
        with self._client_at_lock:
            self._client_at[client.client_id] = self._initial_index
        client.camera.on_update(lambda camera: self._on_camera_move(client.client_id, camera))
        self._update_frustum_visibility()

    def _on_disconnect(self, client: viser.ClientHandle) -> None:
        with self._client_at_lock:
            self._client_at.pop(client.client_id, None)
        self._update_frustum_visibility()

    def _on_camera_move(self, client_id: int, camera) -> None:
        at = self.camera_at(camera.position)
        with self._client_at_lock:
            if client_id not in self._client_at or self._client_at[client_id] == at:
                return
            self._client_at[client_id] = at
        self._update_frustum_visibility()

    def camera_at(self, position) -> Optional[int]:
        """The training camera standing at `position`, if any."""
        if not self.cameras:
            return None
        centers = np.stack([c.position for c in self.cameras])
        distances = np.linalg.norm(centers - np.asarray(position, dtype=np.float64), axis=1)
        nearest = int(np.argmin(distances))
        return nearest if distances[nearest] <= 1e-3 * self.scene_radius else None

    def _update_frustum_visibility(self) -> None:
        with self._client_at_lock:
            occupied = set(self._client_at.values()) if self._client_at else {self._initial_index}
        for index, handle in enumerate(self._frustums):
            visible = index not in occupied
            if handle.visible != visible:
                handle.visible = visible

    def clients(self) -> List[viser.ClientHandle]:
        return list(self.viser.get_clients().values())

    # --- screenshot -----------------------------------------------------------------
    def save_screenshot(self, client: viser.ClientHandle, folder: Path, timeout: float = 20.0) -> Path:
        """Ask `client`'s browser for a frame of its current view and write it as a PNG
        in `folder`, atomically. Returns the path."""
        width = int(client.camera.image_width) or 1280
        height = int(client.camera.image_height) or 720
        rgba = client.get_render(height, width, transport_format="png", timeout=timeout)
        rgb = composite_over(rgba)
        stamp = time.strftime("%Y%m%d_%H%M%S")
        path = Path(folder) / f"screenshot_{stamp}.png"
        suffix = 1
        while path.exists():
            path = Path(folder) / f"screenshot_{stamp}_{suffix}.png"
            suffix += 1
        with atomic_path(path) as tmp:
            if not cv2.imwrite(str(tmp), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)):
                raise TurboGSError(f"cannot write {path}: PNG encoding failed")
        return path

    def add_screenshot_button(self, folder: Path) -> viser.GuiButtonHandle:
        """A "Save screenshot" button that saves the clicking browser's view into `folder`."""
        button = self.viser.gui.add_button("Save screenshot", icon=viser.Icon.CAMERA, disabled=not self.control_allowed)

        def save(event: viser.GuiEvent) -> None:
            client = event.client
            if client is None:
                return
            try:
                path = self.save_screenshot(client, folder)
            except (TurboGSError, TimeoutError, RuntimeError, OSError) as exc:
                self.log(f"viewer: screenshot failed: {exc}")
                client.add_notification("Screenshot failed", str(exc), auto_close_seconds=8.0, color="red")
                return
            self.log(f"viewer: saved {path}")
            client.add_notification("Screenshot saved", str(path), auto_close_seconds=5.0)

        button.on_click(self.guarded("save a screenshot", save))
        return button

    # --- lifetime -------------------------------------------------------------------
    def serve_forever(self) -> None:
        """Block until Ctrl-C."""
        try:
            while not self._closed:
                time.sleep(0.5)
        except KeyboardInterrupt:
            self.log("viewer: stopped")
        finally:
            self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self.renderer is not None:
                self.renderer.close()
            self.viser.stop()
