"""A headless Chromium for the viewer tests: Debian's /usr/bin/chromium driven by Playwright.

Playwright's own browser download is never used (`playwright install` cannot run here);
the system Chromium is launched instead, with WebGL on SwiftShader (a CPU implementation
of Vulkan/GL behind ANGLE), so the splat renderer really draws without a GPU.

On CI (env CI set) a missing Chromium or Playwright is a failure, not a skip: the CI
script installs both (`apt-get install -y chromium`, `pip install playwright`).
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Tuple

import cv2
import numpy as np
import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless=new",
    "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
    "--use-gl=angle",
    "--use-angle=swiftshader",  # WebGL through SwiftShader: no GPU needed
    "--enable-unsafe-swiftshader",  # Chromium >= 139 no longer falls back to it silently
    "--disable-dev-shm-usage",  # small /dev/shm in containers
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


def require_browser() -> None:
    """Skip when no browser is installed on a developer machine; fail on CI."""
    problem = None
    if not CHROMIUM.exists():
        problem = f"{CHROMIUM} is missing (apt-get install -y chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            problem = "the playwright package is missing (pip install playwright)"
    if problem is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"browser tests must run on CI, but {problem}")
    pytest.skip(problem)


@contextmanager
def chromium_page(width: int = 1280, height: int = 720) -> Iterator[object]:
    """A Playwright page in a fresh Chromium profile, closed afterwards."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="turbogs-chromium-") as profile, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": width, "height": height},
        )
        try:
            page = context.pages[0] if context.pages else context.new_page()
            yield page
        finally:
            context.close()


def artifact_paths(name: str) -> List[Path]:
    """Where a test's screenshot goes: tests/artifacts/ and $TURBOGS_ARTIFACTS when set."""
    folders = [ARTIFACTS]
    if os.environ.get("TURBOGS_ARTIFACTS"):
        folders.append(Path(os.environ["TURBOGS_ARTIFACTS"]))
    paths = []
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
        paths.append(folder / name)
    return paths


def screenshot_rgb(target) -> Tuple[bytes, np.ndarray]:
    """A Playwright page's or element's screenshot: the PNG bytes, and the pixels as RGB."""
    png = target.screenshot()
    return png, cv2.cvtColor(cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)


def save_artifact(png: bytes, name: str) -> List[Path]:
    paths = artifact_paths(name)
    for path in paths:
        path.write_bytes(png)
    return paths
