"""`turbogs train --viewer`: watch training in the browser, and pause or stop it.

The training loop calls `update()` every step. That call must cost nothing, so it only
compares the clock with the next refresh time. Every `refresh_seconds` it takes a
snapshot on the training thread (stats, and, when a browser is connected, a copy of the
Gaussians and of the selected view's error memory). Those are the only reads of training
state, so they happen where the state is consistent. Everything else happens in a
background thread: building the splat arrays, colouring the heatmap, sending. A browser
that disconnects, or any failure in that thread, is logged and never reaches training.

Pause/Resume/Stop work from any browser on loopback; off loopback only with `control=True`
(--viewer-control), otherwise the server refuses them (see ViewerServer.guarded).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import viser
import viser.uplot

from turbogs.gaussians import sh_degree_from_coeffs

from .cameras import ViewCamera, cameras_from_scene
from .heatmap import error_overlay
from .server import Log, ViewerServer
from .gpu_render import maybe_add_server_rendering
from .splats import splats_from_params

# Sending the Gaussians costs ~32 bytes each per browser; above this many, splat pushes
# are spaced out proportionally so that a multi-million model does not saturate the link.
SPLAT_PUSH_BUDGET = 500_000
PARAMS_FOR_SPLATS = ("means", "scales", "quats", "opacities", "sh0")


def _clone(tensor):
    """A private copy the training loop cannot change under the background thread."""
    return tensor.detach().clone() if hasattr(tensor, "detach") else np.array(tensor, copy=True)


def _number(value) -> Optional[float]:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


@dataclass
class Snapshot:
    """What one refresh publishes; taken on the training thread."""

    step: int
    total_steps: int
    elapsed: float
    stats: Dict[str, float]
    params: Optional[Dict[str, object]] = None  # cloned tensors, when splats are due
    heatmap_view: int = 0
    heatmap: Optional[object] = None  # [TH, TW] tensor of that view's error memory
    final: bool = False
    done: threading.Event = field(default_factory=threading.Event)


def status_markdown(snap: Snapshot, state: str) -> str:
    """The stats panel; its first line is what the browser test reads."""
    total = max(snap.total_steps, 1)
    lines = [f"**Step** {snap.step:,} / {snap.total_steps:,} ({100.0 * snap.step / total:.0f}%)"]
    loss, psnr = snap.stats.get("loss"), snap.stats.get("psnr")
    count = snap.stats.get("num_gaussians")
    quality = []
    if loss is not None:
        quality.append(f"**Loss** {loss:.4f}")
    if psnr is not None:
        quality.append(f"**PSNR** {psnr:.2f} dB")
    if quality:
        lines.append(" · ".join(quality))
    size = [f"**Gaussians** {int(count):,}"] if count is not None else []
    size.append(f"**Elapsed** {snap.elapsed:.1f} s")
    lines.append(" · ".join(size))
    # What density control did, from the stats its strategy returns (the trainer's progress_stats).
    density = [f"**{label}** {int(snap.stats[key]):,}"
               for key, label in (("grown", "Grown"), ("pruned", "Pruned"), ("budget", "Budget")) if key in snap.stats]
    if density:
        lines.append(" · ".join(density))
    lines.append(f"**State** {state}")
    return "  \n".join(lines)


class LiveViewer:
    """A browser view of a training run: stats, curves, Gaussians, error heatmaps, and
    Pause/Resume/Stop buttons the training loop honours."""

    def __init__(
        self,
        cameras: Sequence,
        host: str = "127.0.0.1",
        port: int = 8080,
        refresh_seconds: float = 2.0,
        log: Log = print,
        control: bool = False,
        antialiased: bool = False,
    ):
        """control: let browsers pause, resume and stop training even when `host` is not
        loopback (--viewer-control); on loopback they always can. antialiased: the model
        trains with --antialiased, so the server-side render uses it too."""
        self.log = log
        self.antialiased = bool(antialiased)
        self.refresh_seconds = float(refresh_seconds)
        self.views: List[ViewCamera] = cameras_from_scene(cameras)
        self.server = ViewerServer(host, port, title="TurboGS training", log=log, control=control,
                                   controls="pause, resume or stop training")

        self._started = time.monotonic()
        self._next_refresh = 0.0  # the first update() refreshes at once
        self._next_splats = 0.0
        self._closed = False
        self._paused = False
        self._stop_requested = False
        self._resume = threading.Event()
        self._resume.set()
        self._selected_view = 0
        self._state = "training"
        self._last_snapshot: Optional[Snapshot] = None
        self._render_source = None  # (params, sh_degree, antialiased) for server-side rendering
        self._errors_logged: set = set()
        self.steps: List[int] = []  # curve history, written by the worker only
        self.losses: List[float] = []
        self.psnrs: List[float] = []

        self._place_cameras()
        self._build_gui()

        self._mailbox: Optional[Snapshot] = None
        self._mail_lock = threading.Lock()
        self._mail = threading.Event()
        self._worker = threading.Thread(target=self._work, name="turbogs-live-viewer", daemon=True)
        self._worker.start()

    # --- setup ----------------------------------------------------------------------
    def _place_cameras(self) -> None:
        if self.views:
            # Until the first Gaussians arrive, the cameras tell where the scene is.
            self.server.set_scene_bounds(np.stack([v.position for v in self.views]))
        self.server.set_cameras(self.views)
        self.server.set_initial_view(0 if self.views else None)

    def _build_gui(self) -> None:
        gui = self.server.viser.gui
        with gui.add_folder("Training"):
            self.status = gui.add_markdown("**Step** 0 / 0  \n**State** starting")
            self.progress = gui.add_progress_bar(0.0)
            off = not self.server.control_allowed
            self.pause_button = gui.add_button("Pause", icon=viser.Icon.PLAYER_PAUSE, disabled=off)
            self.resume_button = gui.add_button("Resume", icon=viser.Icon.PLAYER_PLAY, disabled=True)
            self.stop_button = gui.add_button("Stop", icon=viser.Icon.PLAYER_STOP, color="red", disabled=off)
            if off:
                gui.add_markdown(self.server.control_note())
        self.pause_button.on_click(self.server.guarded("pause training", lambda _: self.pause()))
        self.resume_button.on_click(self.server.guarded("resume training", lambda _: self.resume()))
        self.stop_button.on_click(self.server.guarded("stop training", lambda _: self.request_stop()))

        with gui.add_folder("Curves"):
            # uPlot never draws a chart created without points, even once points arrive: start
            # with one invisible point (y = NaN); the first refresh replaces the whole series.
            placeholder = (np.zeros(1), np.full(1, np.nan))
            steps_axis = {"x": viser.uplot.Scale(time=False)}  # steps, not UNIX timestamps
            self.loss_plot = gui.add_uplot(
                placeholder, (viser.uplot.Series(label="step"), viser.uplot.Series(label="loss", stroke="#d9480f", width=2)),
                title="Loss", aspect=2.0, scales=steps_axis,
            )  # fmt: skip
            self.psnr_plot = gui.add_uplot(
                placeholder, (viser.uplot.Series(label="step"), viser.uplot.Series(label="PSNR (dB)", stroke="#1971c2", width=2)),
                title="PSNR", aspect=2.0, scales=steps_axis,
            )  # fmt: skip

        with gui.add_folder("Error heatmap"):
            names = [f"{i}: {v.name}" for i, v in enumerate(self.views)] or ["(no views)"]
            self.view_dropdown = gui.add_dropdown("View", names, initial_value=names[0])
            first = self.views[0].thumbnail if self.views and self.views[0].thumbnail is not None else None
            self.heatmap_image = gui.add_image(first if first is not None else np.full((96, 128, 3), 40, np.uint8))
            self.heatmap_caption = gui.add_markdown("Error memory of the selected view (red = largest).")
        self.view_dropdown.on_update(lambda _: self._select_view(self.view_dropdown.value))
        self.server.renderer = maybe_add_server_rendering(self.server, lambda: self._render_source)

    def _select_view(self, label: str) -> None:
        try:
            self._selected_view = int(str(label).split(":", 1)[0])
        except ValueError:
            self._selected_view = 0

    # --- the training loop's side ---------------------------------------------------
    def update(
        self,
        step: int,
        total_steps: int,
        stats: Dict[str, object],
        params: Optional[Callable[[], Dict[str, object]]] = None,
        error_heatmap: Optional[Callable[[int], object]] = None,
    ) -> None:
        """Call every step. Between refreshes this is one clock read.

        stats: numbers (floats or 0-d tensors) shown in the panel: "loss", "psnr",
            "num_gaussians", and "elapsed" (seconds; the viewer's own clock otherwise).
        params: returns the raw pre-activation tensors (Gaussians.raw()); called only at a
            refresh while a browser is connected.
        error_heatmap: view index -> [TH, TW] error memory of that view; called likewise.
        """
        now = time.monotonic()
        if now < self._next_refresh:
            return
        self._next_refresh = now + self.refresh_seconds
        try:
            self._post(self._snapshot(step, total_steps, stats, params, error_heatmap, now))
        except Exception as exc:  # the viewer must never stop training
            self._log_once("snapshot", f"viewer: could not take a snapshot ({type(exc).__name__}: {exc})")

    def _snapshot(self, step, total_steps, stats, params, error_heatmap, now, final=False) -> Snapshot:
        numbers = {k: v for k, v in ((k, _number(v)) for k, v in stats.items()) if v is not None}
        elapsed = numbers.pop("elapsed", now - self._started)
        snap = Snapshot(step=int(step), total_steps=int(total_steps), elapsed=elapsed, stats=numbers, final=final)
        watched = final or bool(self.server.viser.get_clients())
        if params is not None and watched and (final or now >= self._next_splats):
            raw = params() if callable(params) else params
            names = list(PARAMS_FOR_SPLATS)
            if final or (self.server.renderer is not None and self.server.renderer.enabled):
                names.append("shN")  # only the server render uses the higher SH bands
            snap.params = {name: _clone(raw[name]) for name in names if name in raw}
            count = int(snap.params["means"].shape[0])
            self._next_splats = now + self.refresh_seconds * max(1.0, count / SPLAT_PUSH_BUDGET)
        if error_heatmap is not None and watched and self.views:
            snap.heatmap_view = min(self._selected_view, len(self.views) - 1)
            snap.heatmap = _clone(error_heatmap(snap.heatmap_view))
        return snap

    def wait_if_paused(self, until: Callable[[], bool] = lambda: False) -> None:
        """Blocks while the Pause button is active; Resume or Stop releases it, and so does
        `until()` turning true (the trainer's: a signal came, which stops the run like Stop)."""
        if not self._paused:
            return
        while self._paused and not self._stop_requested and not self._closed and not until():
            self._resume.wait(timeout=0.25)

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    @property
    def paused(self) -> bool:
        return self._paused

    # --- buttons ----------------------------------------------------------------------
    def pause(self) -> None:
        self._paused = True
        self._resume.clear()
        self.pause_button.disabled = True
        self.resume_button.disabled = False
        self._set_state("paused")

    def resume(self) -> None:
        self._paused = False
        self._resume.set()
        self.pause_button.disabled = False
        self.resume_button.disabled = True
        self._set_state("training")

    def request_stop(self) -> None:
        self._stop_requested = True
        self._paused = False
        self._resume.set()
        for button in (self.pause_button, self.resume_button, self.stop_button):
            button.disabled = True
        self._set_state("stopping (saving the model)")

    def _set_state(self, state: str) -> None:
        self._state = state
        if self._last_snapshot is not None:
            self.status.content = status_markdown(self._last_snapshot, state)

    # --- the background thread ------------------------------------------------------
    def _post(self, snap: Snapshot) -> None:
        with self._mail_lock:
            self._mailbox = snap  # an unsent older snapshot is simply replaced
        self._mail.set()

    def _work(self) -> None:
        while not self._closed:
            if not self._mail.wait(timeout=0.5):
                continue
            self._mail.clear()
            with self._mail_lock:
                snap, self._mailbox = self._mailbox, None
            if snap is None:
                continue
            try:
                self.publish(snap)
            except Exception as exc:  # a vanished browser or a bad value must not end the viewer
                self._log_once(type(exc).__name__, f"viewer: update failed ({type(exc).__name__}: {exc})")
            finally:
                snap.done.set()

    def publish(self, snap: Snapshot) -> None:
        """Send one snapshot to the browsers (runs in the background thread)."""
        self._last_snapshot = snap
        self.status.content = status_markdown(snap, self._state)
        self.progress.value = float(np.clip(100.0 * snap.step / max(snap.total_steps, 1), 0.0, 100.0))
        if "loss" in snap.stats or "psnr" in snap.stats:
            self.steps.append(snap.step)
            self.losses.append(snap.stats.get("loss", np.nan))
            self.psnrs.append(snap.stats.get("psnr", np.nan))
            x = np.asarray(self.steps, dtype=np.float64)
            self.loss_plot.data = (x, np.asarray(self.losses, dtype=np.float64))
            self.psnr_plot.data = (x, np.asarray(self.psnrs, dtype=np.float64))
        if snap.params is not None:
            splats = splats_from_params(snap.params)
            first = self.server.splats_handle is None
            self.server.set_scene_bounds(splats.centers)
            renderer = self.server.renderer
            self.server.set_splats(splats, visible=not (renderer is not None and renderer.enabled))
            if "shN" in snap.params:
                degree = sh_degree_from_coeffs(int(snap.params["shN"].shape[1]))
                self._render_source = (snap.params, degree, self.antialiased)
                if renderer is not None:
                    for client in self.server.clients():
                        renderer.request(client)
            if first:
                self.server.set_initial_view(0 if self.views else None)
        if snap.heatmap is not None:
            view = self.views[snap.heatmap_view]
            image, peak = error_overlay(snap.heatmap, view.thumbnail, view_size=(view.width, view.height))
            self.heatmap_image.image = image
            self.heatmap_caption.content = f"Error memory of **{view.name}** at step {snap.step:,} (red = {peak:.4g})."

    def _log_once(self, key: str, message: str) -> None:
        if key not in self._errors_logged:
            self._errors_logged.add(key)
            self.log(message)

    # --- the end ----------------------------------------------------------------------
    def finish(self, params: Dict[str, object], block: bool = True, step: Optional[int] = None,
               total_steps: Optional[int] = None, stats: Optional[Dict[str, object]] = None) -> None:
        """Show the final model (sent even with no browser open, so one opened later sees
        it) and, with `block`, keep serving until Ctrl-C."""
        last = self._last_snapshot
        step = step if step is not None else (last.step if last else 0)
        total = total_steps if total_steps is not None else (last.total_steps if last else step)
        merged = dict(last.stats) if last else {}
        merged.update(stats or {})
        if "num_gaussians" not in merged and "means" in params:
            merged["num_gaussians"] = int(params["means"].shape[0])
        self._state = "finished"
        for button in (self.pause_button, self.resume_button, self.stop_button):
            button.disabled = True
        try:
            snap = self._snapshot(step, total, merged, params, None, time.monotonic(), final=True)
            self._post(snap)
            snap.done.wait(timeout=120.0)
        except Exception as exc:
            self._log_once("finish", f"viewer: could not show the final model ({type(exc).__name__}: {exc})")
        if block:
            self.log(f"viewer: training finished; still serving {self.server.url} (Ctrl-C to quit)")
            self.server.serve_forever()
            self.close()

    def close(self) -> None:
        """Stop the background thread first (it may be mid-send), then the server."""
        self._closed = True
        self._resume.set()
        self._mail.set()
        if self._worker is not threading.current_thread():
            self._worker.join(timeout=10.0)
        self.server.close()
