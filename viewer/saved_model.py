"""`turbogs view MODEL`: show a trained model in the browser."""

from __future__ import annotations

from pathlib import Path
from typing import Union

import numpy as np

from .model_files import LoadedModel, load_model
from .server import Log, ViewerServer
from .gpu_render import maybe_add_server_rendering
from .splats import splats_from_params


def model_summary(model: LoadedModel, bounds: np.ndarray) -> str:
    """The info panel's markdown: what was loaded and how big it is."""
    lo, hi = bounds
    lines = [
        f"**Gaussians:** {model.num_gaussians:,}",
        f"**SH degree:** {model.sh_degree}",
        f"**Training cameras:** {len(model.cameras)}",
        f"**Scene bounds (98%):** [{lo[0]:.2f}, {lo[1]:.2f}, {lo[2]:.2f}] to [{hi[0]:.2f}, {hi[1]:.2f}, {hi[2]:.2f}]",
    ]
    if model.step is not None:
        lines.insert(0, f"**Iteration:** {model.step:,}")
    return "  \n".join(lines)


def serve_model(
    model: Union[str, Path], host: str = "127.0.0.1", port: int = 8080, *, block: bool = True, log: Log = print,
    control: bool = False,
) -> ViewerServer:
    """Load `model` (an INRIA model folder or a .ply) and serve it. With `block`, return
    only after Ctrl-C (the server is closed then); otherwise return the running server.
    control: let browsers off loopback save screenshots here too (--viewer-control)."""
    loaded = load_model(model)
    splats = splats_from_params(loaded.params)
    server = ViewerServer(host, port, title="TurboGS", log=log, control=control,
                          controls="save screenshots into the model folder")
    server.model = loaded
    bounds = server.set_scene_bounds(splats.centers)
    server.set_splats(splats)
    server.set_cameras(loaded.cameras)
    server.set_initial_view(0 if loaded.cameras else None)

    gui = server.viser.gui
    with gui.add_folder("Model"):
        gui.add_markdown(model_summary(loaded, bounds))
        server.add_screenshot_button(loaded.folder)
        if server.control_note():
            gui.add_markdown(server.control_note())
    server.renderer = maybe_add_server_rendering(server, lambda: (loaded.params, loaded.sh_degree, loaded.antialiased))
    log(f"viewer: {loaded.num_gaussians:,} Gaussians from {loaded.ply_path}")
    if block:
        server.serve_forever()
    return server
