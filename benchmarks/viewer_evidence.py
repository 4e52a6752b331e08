"""Evidence for the web viewer, re-runnable: two screenshots and the cost of watching.

    python benchmarks/viewer_evidence.py            # all three parts (about 5 minutes on 2 cores)
    python benchmarks/viewer_evidence.py view       # 1: `turbogs view` of a trained real capture
    python benchmarks/viewer_evidence.py live       # 2: the live view of a training run, with its heatmap
    python benchmarks/viewer_evidence.py slowdown   # 3: training seconds without / with a viewer / with a browser

The browser is the tests' headless Chromium (tests/browser.py: Debian's /usr/bin/chromium,
WebGL on SwiftShader). Every turbogs command runs as a subprocess, exactly as a user types it,
so the numbers include nothing this script does in-process.

Part 3 also reads the CPU seconds of every Chromium process from /proc/<pid>/stat: on a
small CPU-only machine the browser (SwiftShader draws WebGL on the CPU) competes with
training for the same cores, and that share must be told apart from the viewer's own cost.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import cv2
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from browser import chromium_page, screenshot_rgb  # noqa: E402  (the tests' Chromium launcher)
from turbogs.viewer.server import FRUSTUM_COLOR  # noqa: E402

SCREENSHOTS = REPO / "docs" / "screenshots"
RESULTS = REPO / "benchmarks" / "results"
RESULT_NAME = "2026-12-02_cpu_viewer_slowdown"
COLMAP_MODEL = Path("/tmp/runs/colmap_turbo")  # turbo, 2000 steps on ../shared/data/test_colmap at -r 8
DEMO_SCENE = "scenes/demo"
URL_LINE = re.compile(r"viewer: open (http://\S+) in a browser")
STEP_TEXT = re.compile(r"Step\s+([\d,]+)\s*/\s*([\d,]+)")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
LOSS_RGB, PSNR_RGB = (0xD9, 0x48, 0x0F), (0x19, 0x71, 0xC2)  # the curve strokes in turbogs.viewer.live


# --- processes ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Turbogs:
    """`python -m turbogs ARGS` in the background; its output is collected by a thread
    (so a full pipe never stalls it) and scanned for the viewer's URL."""

    def __init__(self, args: List[str]):
        self.command = [sys.executable, "-m", "turbogs", *args]
        self.lines: List[str] = []
        self.url: Optional[str] = None
        self._url_seen = threading.Event()
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(self.command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, bufsize=1)
        self.rusage = None
        self.wall_seconds: Optional[float] = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            match = URL_LINE.search(line)
            if match and self.url is None:
                self.url = match.group(1).replace("localhost", "127.0.0.1")
                self._url_seen.set()

    def wait_for_url(self, timeout: float = 120.0) -> str:
        deadline = time.time() + timeout
        while not self._url_seen.wait(0.2):
            if self.poll() is not None or time.time() > deadline:
                raise RuntimeError("no viewer URL from " + " ".join(self.command) + "\n" + "\n".join(self.lines[-20:]))
        return self.url

    def poll(self) -> Optional[int]:
        """The exit code once the process has ended, else None. Reaps it with wait4, which
        also returns the process's own CPU seconds (Popen.poll would lose them)."""
        if self.proc.returncode is None:
            pid, status, rusage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self.wall_seconds = time.perf_counter() - self.started
                self.rusage = rusage
                self.proc.returncode = os.waitstatus_to_exitcode(status)
        return self.proc.returncode

    def wait(self, timeout: float = 600.0) -> int:
        deadline = time.time() + timeout
        while self.poll() is None:
            if time.time() > deadline:
                raise TimeoutError(f"{' '.join(self.command)} ran past {timeout:.0f} s")
            time.sleep(0.1)
        return self.proc.returncode

    def stop(self) -> None:
        if self.poll() is None:
            self.proc.terminate()
            try:
                self.wait(timeout=15)
            except TimeoutError:
                self.proc.kill()
                self.wait(timeout=15)

    @property
    def cpu_seconds(self) -> Optional[float]:
        return None if self.rusage is None else self.rusage.ru_utime + self.rusage.ru_stime


def proc_stat(pid: int):
    """(command name, parent pid, user+system CPU seconds) of a live process, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()  # fields[0] is field 3 (state) of proc(5)
    return name, int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def descendants(root: int) -> Dict[int, tuple]:
    """Every live process below `root`: pid -> (name, cpu seconds)."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = proc_stat(int(entry.name))
            if stat is not None:
                stats[int(entry.name)] = stat
    found, frontier = {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (name, ppid, cpu) in stats.items():
            if ppid == parent and pid not in found:
                found[pid] = (name, cpu)
                frontier.append(pid)
    return found


class ClientCpuMeter:
    """Samples the CPU seconds of the browser side (Playwright's driver and every Chromium
    process it started) once a second; processes that exit keep their last reading."""

    def __init__(self, exclude_pid: int):
        self.exclude = exclude_pid  # the training process (also a child of this script)
        self.start_cpu: Dict[int, float] = {}
        self.last: Dict[int, tuple] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _client(self) -> Dict[int, tuple]:
        below = descendants(os.getpid())
        training = set(descendants(self.exclude)) | {self.exclude}
        return {pid: v for pid, v in below.items() if pid not in training}

    def start(self) -> None:
        self.start_cpu = {pid: cpu for pid, (_, cpu) in self._client().items()}
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.last.update(self._client())

    def stop(self) -> Dict[str, float]:
        self._stop.set()
        self._thread.join()
        self.last.update(self._client())
        by_name: Dict[str, float] = {}
        for pid, (name, cpu) in self.last.items():
            by_name[name] = by_name.get(name, 0.0) + cpu - self.start_cpu.get(pid, 0.0)
        return {name: round(seconds, 2) for name, seconds in sorted(by_name.items())}


# --- looking at pages ---------------------------------------------------------------


def screenshot(page) -> np.ndarray:
    return screenshot_rgb(page)[1]


def save_png(image: np.ndarray, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not cv2.imwrite(str(path), cv2.cvtColor(image, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_PNG_COMPRESSION, 9]):
        raise RuntimeError(f"cannot write {path}")


def color_fraction(image: np.ndarray, rgb, tolerance: int = 45) -> float:
    distance = np.abs(image[..., :3].astype(np.int32) - np.asarray(rgb, np.int32)).max(axis=-1)
    return float((distance <= tolerance).mean())


def dismiss_software_webgl_notice(page) -> bool:
    """viser warns that WebGL runs in software (SwiftShader): true here, but it covers the
    scene in a screenshot. Close it like a user would."""
    notice = page.locator(".mantine-Notification-root", has_text="Software WebGL")
    if notice.count() == 0:
        return False
    notice.first.locator("button").first.click()
    page.wait_for_timeout(500)
    return True


def wait_until_settled(page, region, timeout: float = 60.0, poll: float = 2.0) -> np.ndarray:
    """Screenshots until two in a row agree in `region` (x0, y0, x1, y1): the splats
    have arrived and SwiftShader has drawn them."""
    x0, y0, x1, y1 = region
    previous = screenshot(page)
    deadline = time.time() + timeout
    while time.time() < deadline:
        time.sleep(poll)
        current = screenshot(page)
        change = np.abs(current[y0:y1, x0:x1].astype(np.int16) - previous[y0:y1, x0:x1].astype(np.int16)).mean()
        content = current[y0:y1, x0:x1].std()
        if change < 0.5 and content > 10:
            return current
        previous = current
    return previous


def dom_step_from_text(text: str) -> Optional[int]:
    """The training step in the live panel's first line ("Step 1,234 / 2,000")."""
    match = STEP_TEXT.search(text)
    return int(match.group(1).replace(",", "")) if match else None


def dom_step(page) -> Optional[int]:
    return dom_step_from_text(page.inner_text("body"))


# --- 1: turbogs view ------------------------------------------------------------------


def shoot_view(model: Path = COLMAP_MODEL, out: Path = SCREENSHOTS / "view_test_colmap.png") -> dict:
    if not (model / "cameras.json").is_file():
        raise SystemExit(f"{model}: no trained model there (train ../shared/data/test_colmap at -r 8 into it first)")
    port = free_port()
    server = Turbogs(["view", str(model), "--port", str(port)])
    try:
        url = server.wait_for_url()
        with chromium_page(1280, 720) as page:
            page.goto(url)
            page.wait_for_selector("canvas", timeout=60_000)
            page.get_by_text("Save screenshot").wait_for(timeout=60_000)
            dismissed = dismiss_software_webgl_notice(page)
            image = wait_until_settled(page, (0, 0, 930, 720))
            save_png(image, out)
            info = page.inner_text("body")
    finally:
        server.stop()
    scene = image[:, :930]  # left of the control panel
    gaussians = re.search(r"Gaussians:\s*([\d,]+)", info)
    result = {
        "command": f"python -m turbogs view {model} --port {port}",
        "screenshot": str(out.relative_to(REPO)),
        "size": [int(image.shape[1]), int(image.shape[0])],
        "panel_says_gaussians": gaussians.group(1) if gaussians else None,
        "frustum_blue_fraction": round(color_fraction(scene, FRUSTUM_COLOR), 4),
        "scene_pixel_std": round(float(scene.std()), 1),
        "software_webgl_notice_dismissed": dismissed,
    }
    print("view:", json.dumps(result))
    return result


# --- 2: the live view with the heatmap ----------------------------------------------------


def curve_pixels(page, image: np.ndarray) -> int:
    """Pixels of the loss or PSNR line inside the two charts: zero while the curves are empty."""
    count = 0
    for chart in page.locator(".uplot").all():
        box = chart.bounding_box()
        if box is None:
            continue
        x0, y0 = int(box["x"]), int(box["y"])
        crop = image[y0 : y0 + int(box["height"]), x0 : x0 + int(box["width"])]
        count += int(round((color_fraction(crop, LOSS_RGB, 40) + color_fraction(crop, PSNR_RGB, 40)) * crop[..., 0].size))
    return count


def traceback_text(lines: List[str]) -> List[str]:
    """Each traceback in a process's output, as its first and last line."""
    found = []
    for i, line in enumerate(lines):
        if line.startswith("Traceback"):
            end = i + 1
            while end < len(lines) and (lines[end].startswith(" ") or not lines[end].strip()):
                end += 1
            found.append(lines[i] + " ... " + (lines[end] if end < len(lines) else ""))
    return found


def pick_view(page, index: int) -> str:
    """Choose training view `index` in the heatmap's dropdown with the keyboard (a mouse click
    is sometimes refused while viser's overlays are animating): open, move down, Enter."""
    box = page.get_by_label("View").first
    box.focus()
    page.keyboard.press("ArrowDown")  # opens the list
    options = page.get_by_role("option")
    options.first.wait_for(timeout=30_000)
    target = options.nth(index)
    label = target.inner_text().strip()
    for _ in range(options.count() + 1):
        if target.get_attribute("data-combobox-selected") is not None:
            break
        page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")
    page.wait_for_timeout(300)
    if box.input_value() != label:
        raise RuntimeError(f"could not pick '{label}' in the View dropdown (it shows '{box.input_value()}')")
    return label


def open_live_page(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("canvas", timeout=60_000)
    page.get_by_text("Error memory of", exact=False).first.wait_for(timeout=120_000)
    dismiss_software_webgl_notice(page)


def shoot_live(out: Path = SCREENSHOTS / "live_heatmap.png", steps: int = 1000, view_index: int = 5) -> dict:
    """Steps: 1000, not 400: on the shared 2-core box 400 steps ran out ~25 s after the page opened,
    about the time two SwiftShader screenshots of a 1280x1350 page take under that load."""
    port = free_port()
    out_dir = "/tmp/live_demo"
    args = ["train", DEMO_SCENE, "--eval", "--steps", str(steps), "--viewer", "--port", str(port), "--no-block",
            "--out", out_dir, "--overwrite", "--quiet"]
    run = Turbogs(args)
    progress = []
    # Tall enough that the control panel shows the step counter, both curves and the heatmap at once.
    width, height = 1280, 1350
    image = text = None
    curves_first_load = None
    try:
        url = run.wait_for_url()
        with chromium_page(width, height) as page:
            open_live_page(page, url)
            opened = time.time()
            picked = pick_view(page, view_index)  # early: the server switches views at its next refresh
            wanted = f"Error memory of {picked.split(':', 1)[1].strip()}"
            # Frames are kept only while training still runs: once the process exits, viser greys
            # out the panel of a disconnected page. The first frame showing the picked view's
            # heatmap with drawn curves is the one saved; until then, the latest live frame.
            deadline = time.time() + 300
            while time.time() < deadline and run.poll() is None:
                started = time.time()
                # The text first, so that the picked view's caption, once read, is surely in the picture.
                # A SwiftShader screenshot can take 10 s: the step in the picture may be later.
                frame_text = page.inner_text("body")
                frame = screenshot(page)
                if run.poll() is not None:
                    break
                curves = curve_pixels(page, frame)
                progress.append({"step": dom_step_from_text(frame_text), "screenshot_seconds": round(time.time() - started, 1),
                                 "curve_pixels": curves})
                # The page opened before the first curve point: do its charts draw without a reload?
                if curves_first_load is None and (curves >= 50 or time.time() - opened >= 6):
                    curves_first_load = curves
                image, text, image_curves = frame, frame_text, curves
                if wanted in frame_text and curves >= 50:
                    break
            if image is None:
                raise RuntimeError(f"training ended before the live page could be captured; pass more --live-steps ({progress})")
            save_png(image, out)
    finally:
        run.wait(timeout=300)
    caption = re.search(r"Error memory of\s+(.+?) at step ([\d,]+)[^\n]*", text)
    result = {
        "command": "python -m turbogs " + " ".join(args),
        "screenshot": str(out.relative_to(REPO)),
        "size": [width, height],
        "step_in_page_text_before_screenshot": dom_step_from_text(text),
        "heatmap_caption_before_screenshot": caption.group(0) if caption else None,
        "view_picked": picked,
        "heatmap_shows_picked_view": bool(caption) and picked.split(":", 1)[1].strip() in caption.group(0),
        "curve_pixels_first_load": curves_first_load,
        "curve_pixels": image_curves,
        "frames": progress,
        "exit_code": run.proc.returncode,
        "tracebacks_in_output": traceback_text(run.lines),
    }
    print("live:", json.dumps(result))
    return result


# --- 3: the slowdown ------------------------------------------------------------------


MODES = ("no_viewer", "viewer_no_client", "viewer_with_client")


def train_args(mode: str, out_dir: str, steps: int, port: int) -> List[str]:
    args = ["train", DEMO_SCENE, "--eval", "--steps", str(steps), "--preset", "turbo", "--threads", "1",
            "--out", out_dir, "--overwrite", "--quiet"]
    if mode != "no_viewer":
        args += ["--viewer", "--port", str(port), "--no-block"]
    return args


@contextmanager
def maybe_browser(wanted: bool) -> Iterator[object]:
    if not wanted:
        yield None
        return
    with chromium_page(1280, 720) as page:
        page.goto("about:blank")
        yield page


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def one_run(mode: str, steps: int, repeat: int) -> dict:
    out_dir = f"/tmp/viewer_slowdown/{mode}_{repeat}"
    port = free_port()
    args = train_args(mode, out_dir, steps, port)
    load_before = loadavg()
    # The browser starts before training so that its own start-up is not part of the run.
    with maybe_browser(mode == "viewer_with_client") as page:
        run = Turbogs(args)
        meter = None
        if page is not None:
            meter = ClientCpuMeter(exclude_pid=run.proc.pid)
            meter.start()
            page.goto(run.wait_for_url())
            page.wait_for_selector("canvas", timeout=60_000)
            connected_at_step = dom_step(page)
        code = run.wait(timeout=600)
        client_cpu = meter.stop() if meter is not None else None
    if code != 0:
        raise RuntimeError(f"exit {code}: {' '.join(args)}\n" + "\n".join(run.lines[-20:]))
    results = json.loads((Path(out_dir) / "results.json").read_text())
    row = {
        "mode": mode,
        "repeat": repeat,
        "train_seconds": results["train_seconds"],
        "steps": results["steps"],
        "num_gaussians": results["num_gaussians"],
        "psnr": round(results["psnr"], 3),
        "process_wall_seconds": round(run.wall_seconds, 2),
        "training_process_cpu_seconds": round(run.cpu_seconds, 2),
        "load_average_1min_before": load_before,
        "tracebacks_in_output": traceback_text(run.lines),
    }
    if client_cpu is not None:
        row["client_cpu_seconds"] = round(sum(client_cpu.values()), 2)
        row["client_cpu_seconds_by_process"] = client_cpu
        row["client_connected_at_step"] = connected_at_step
    print(f"{mode} #{repeat}: " + json.dumps(row), flush=True)
    return row


def summarize(rows: List[dict]) -> dict:
    summary = {}
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        entry = {
            "train_seconds": [r["train_seconds"] for r in mine],
            "mean_train_seconds": round(float(np.mean([r["train_seconds"] for r in mine])), 2),
            "mean_process_wall_seconds": round(float(np.mean([r["process_wall_seconds"] for r in mine])), 2),
            "mean_training_process_cpu_seconds": round(float(np.mean([r["training_process_cpu_seconds"] for r in mine])), 2),
        }
        if mine and "client_cpu_seconds" in mine[0]:
            entry["mean_client_cpu_seconds"] = round(float(np.mean([r["client_cpu_seconds"] for r in mine])), 2)
        summary[mode] = entry
    base = summary["no_viewer"]["mean_train_seconds"]
    for mode in MODES:
        summary[mode]["slowdown_percent_vs_no_viewer"] = round(100.0 * (summary[mode]["mean_train_seconds"] / base - 1.0), 1)
    return summary


def measure_slowdown(steps: int = 600, repeats: int = 2) -> dict:
    rows = []
    # Interleaved A B C, C B A, ...: load from other jobs that drifts steadily over the minutes
    # then weighs on every configuration alike (a fixed order would always favour the last one).
    for repeat in range(repeats):
        for mode in MODES if repeat % 2 == 0 else MODES[::-1]:
            rows.append(one_run(mode, steps, repeat))
    return {"runs": rows, "summary": summarize(rows),
            "commands": {mode: "python -m turbogs " + " ".join(train_args(mode, f"/tmp/viewer_slowdown/{mode}_R", steps, 0)).replace("--port 0", "--port <free>")
                         for mode in MODES}}


# --- report -------------------------------------------------------------------------


def write_report(slowdown: dict, shots: dict, started: float) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    previous = RESULTS / f"{RESULT_NAME}.json"
    if previous.is_file():  # a `slowdown` run alone keeps the screenshots' entries
        shots = {**json.loads(previous.read_text()).get("screenshots", {}), **shots}
    record = {
        "date": datetime.date.today().isoformat(),
        "script": "python benchmarks/viewer_evidence.py",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "browser": "Debian /usr/bin/chromium, headless, WebGL on SwiftShader (tests/browser.py)"},
        "scene": DEMO_SCENE,
        "what_train_seconds_counts": "the trainer's clock: timed_step() only (not the per-step viewer.update, "
                                     "checkpoint writes, start-up or evaluation)",
        "slowdown": slowdown,
        "screenshots": shots,
        "script_seconds": round(time.perf_counter() - started, 1),
    }
    write_record(record)


def update_screenshots(shots: dict) -> None:
    """A `view` or `live` run alone refreshes its entry in an existing record."""
    record = json.loads((RESULTS / f"{RESULT_NAME}.json").read_text())
    record.setdefault("screenshots", {}).update(shots)
    write_record(record)


def write_record(record: dict) -> None:
    json_path = RESULTS / f"{RESULT_NAME}.json"
    json_path.write_text(json.dumps(record, indent=2) + "\n")
    md_path = RESULTS / f"{RESULT_NAME}.md"
    md_path.write_text(markdown(record))
    print(f"wrote {json_path} and {md_path}")


def markdown(record: dict) -> str:
    slowdown, s = record["slowdown"], record["slowdown"]["summary"]
    runs = slowdown["runs"]
    lines = [
        "# Training slowdown with the web viewer (CPU, demo scene)",
        "",
        f"Date {record['date']}; {record['machine']['cpus']} CPU cores shared with other jobs (see the load "
        f"averages below); torch on 1 thread. Produced by `python benchmarks/viewer_evidence.py` "
        f"(raw numbers: `{RESULT_NAME}.json`).",
        "",
        f"Three configurations, run interleaved (A B C, then C B A), {len(runs) // len(MODES)} repeats each "
        "(`R` = repeat number, `<free>` = a free port):",
        "",
    ]
    for mode in MODES:
        lines.append(f"- **{mode}**: `{slowdown['commands'][mode]}`")
    lines += [
        "",
        "In *viewer_with_client* a headless Chromium (tests/browser.py: Debian's chromium, WebGL on "
        "SwiftShader) is started before training and opens the page as soon as the server prints its URL, "
        "staying connected to the end.",
        "",
        "| configuration | train_seconds (runs) | mean | slowdown vs no viewer | training process CPU s | client CPU s |",
        "|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        e = s[mode]
        client = f"{e['mean_client_cpu_seconds']:.1f}" if "mean_client_cpu_seconds" in e else "-"
        lines.append(f"| {mode} | {', '.join(f'{t:.1f}' for t in e['train_seconds'])} | {e['mean_train_seconds']:.1f} | "
                     f"{e['slowdown_percent_vs_no_viewer']:+.1f} % | {e['mean_training_process_cpu_seconds']:.1f} | {client} |")
    lines += ["", "Per run (in the order they ran):", "",
              "| run | mode | train_seconds | process wall s | training process CPU s | client CPU s | load avg before |",
              "|---|---|---|---|---|---|---|"]
    for i, r in enumerate(runs):
        client = f"{r['client_cpu_seconds']:.1f}" if "client_cpu_seconds" in r else "-"
        lines.append(f"| {i + 1} | {r['mode']} | {r['train_seconds']:.1f} | {r['process_wall_seconds']:.1f} | "
                     f"{r['training_process_cpu_seconds']:.1f} | {client} | {r['load_average_1min_before']:.2f} |")
    with_client = [r for r in runs if "client_cpu_seconds" in r]
    cores = sum(r["client_cpu_seconds"] for r in with_client) / sum(r["process_wall_seconds"] for r in with_client)
    spread = max(100.0 * (max(t) / min(t) - 1.0) for t in (s[mode]["train_seconds"] for mode in MODES))
    lines += [
        "",
        "How to read it:",
        "",
        "- `train_seconds` comes from each run's `results.json`: the trainer's clock, which counts the training "
        "steps only (not the viewer's per-step `update()` call, evaluation or start-up). The snapshot that "
        "`update()` takes every 2 s (a copy of a few thousand Gaussians) is therefore not in it; the viewer's "
        "background thread (building splats, sending) is, through competition for the cores.",
        "- *training process CPU s* is the user+system time of the whole `turbogs train` process (start-up "
        "and evaluation included), from `wait4`: what the viewer costs the trainer itself. It is less "
        "sensitive to other jobs than wall time, but not immune (shared caches and cores).",
        f"- *client CPU s* is the user+system time of Playwright's driver and every Chromium process during the "
        f"run, summed from `/proc/<pid>/stat`. With a page open the browser used {cores:.2f} CPU cores on "
        "average: SwiftShader draws every WebGL frame of the splat scene on the CPU. On this 2-core machine "
        "that competes with the single training thread whenever other jobs hold the second core, so the "
        "*with client* figure measures a browser on the same small box more than the viewer. A browser on "
        "another machine takes none of these cores, and one with a GPU far fewer (not measured here).",
        f"- Noise: the repeats of one configuration differ by up to {spread:.0f} % here, and the load from "
        "other jobs changed between runs (last column); differences smaller than that are not a measured effect.",
    ]
    shots = record.get("screenshots") or {}
    if shots:
        lines += ["", "## Screenshots", ""]
        for name, shot in shots.items():
            details = {k: v for k, v in shot.items() if k not in ("command", "screenshot")}
            lines.append(f"- **{name}**: `{shot['screenshot']}` from `{shot['command']}`; checks: `{json.dumps(details)}`")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("part", nargs="?", default="all", choices=["all", "view", "live", "slowdown"])
    parser.add_argument("--steps", type=int, default=600, help="training steps of each slowdown run (default 600)")
    parser.add_argument("--repeats", type=int, default=2, help="repeats of each slowdown configuration (default 2)")
    parser.add_argument("--live-steps", type=int, default=1000, help="training steps of the live screenshot run (default 1000)")
    args = parser.parse_args()
    started = time.perf_counter()
    shots = {}
    if args.part in ("all", "view"):
        shots["view"] = shoot_view()
    if args.part in ("all", "live"):
        shots["live"] = shoot_live(steps=args.live_steps)
    if args.part in ("all", "slowdown"):
        write_report(measure_slowdown(args.steps, args.repeats), shots, started)
    elif (RESULTS / f"{RESULT_NAME}.json").is_file():
        update_screenshots(shots)
    print(f"done in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
